"""Content-Transfer-Encoding: a part's content decoded (base64,
quoted-printable, or as is), sliced *before* decoding so a gigantic part
costs only what the text budget can keep. Damaged encodings are decoded as
far as they can be, with a note."""

from __future__ import annotations

import binascii

from .notes import Notes, quote

__all__ = ["repair_base64", "transfer_decode"]

#: Deleting these leaves the bytes that have no place in base64 at all.
_B64_CLEAN = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/= \t\r\n"
_NOT_B64_OR_PAD = bytes(c for c in range(256) if not (
    48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122 or c in b"+/="))


def repair_base64(data: bytes) -> bytes:
    """Decode what can be decoded: stray characters dropped, every run
    between padding decoded on its own (some encoders concatenate), a
    dangling last character dropped."""
    out = []
    for run in data.translate(None, _NOT_B64_OR_PAD).split(b"="):
        rest = len(run) % 4
        if rest == 1:
            run = run[:-1]
        elif rest:
            run += b"=" * (4 - rest)
        if run:
            out.append(binascii.a2b_base64(run))
    return b"".join(out)


def transfer_decode(buf: bytes, start: int, end: int, cte: str, limit: int, where: str,
                    notes: Notes) -> tuple[bytes, bool]:
    """The content buf[start:end], transfer-decoded, about ``limit`` bytes at
    most: the encoded form is sliced *before* decoding. ``cte`` is the
    lower-case Content-Transfer-Encoding. Returns (data, cut)."""
    if cte == "base64":
        # 4 characters per 3 bytes, plus a line break per 76 characters.
        span = limit * 4 // 3 + limit // 19 + 64
        cut = end - start > span
        chunk = buf[start:start + span] if cut else buf[start:end]
        if not cut:
            # Stray characters (which the decoder skips) or padding in
            # the middle (where it stops) mean the data is damaged.
            pad = chunk.find(b"=")
            if not chunk.translate(None, _B64_CLEAN) and (
                    pad < 0 or pad >= len(chunk.rstrip(b"= \t\r\n"))):
                try:
                    return binascii.a2b_base64(chunk), False
                except binascii.Error:
                    pass  # a missing "=": repaired silently, no harm done
            else:
                notes.add(f"invalid base64 in {where}; decoded what was readable")
        return repair_base64(chunk), cut
    if cte == "quoted-printable":
        span = 3 * limit + 3
        cut = end - start > span
        chunk = buf[start:start + span] if cut else buf[start:end]
        data = binascii.a2b_qp(chunk)
        # The decoder keeps invalid escapes as they are: any "=" beyond
        # the encoded ones (=3D) means there was one. Counting is cheap.
        if not cut and b"=" in data and \
                data.count(b"=") > chunk.count(b"=3D") + chunk.count(b"=3d"):
            notes.add(f"invalid quoted-printable in {where}; kept undecodable "
                      f"sequences as they are")
        return data, cut
    if cte not in ("", "7bit", "8bit", "binary"):
        notes.add(f"unknown Content-Transfer-Encoding {quote(cte)} in {where}; read as is")
    cut = end - start > limit
    return (buf[start:start + limit] if cut else buf[start:end]), cut
