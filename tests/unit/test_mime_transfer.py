"""mail/mime/transfer.py: Content-Transfer-Encoding decoding, sliced
before decoding, damaged encodings repaired with a note."""

from __future__ import annotations

import base64
import quopri

import pytest

from nexarch_events.mail.mime.notes import Notes
from nexarch_events.mail.mime.transfer import repair_base64, transfer_decode


def decode(data: bytes, cte: str, limit: int = 1_000_000
           ) -> tuple[bytes, bool, tuple[str, ...]]:
    notes = Notes()
    # Offsets into a larger buffer, as the walker passes them.
    buf = b"HEAD" + data + b"TAIL"
    out, cut = transfer_decode(buf, 4, 4 + len(data), cte, limit, "part 1", notes)
    return out, cut, notes.result()


def test_valid_base64_and_quoted_printable() -> None:
    text = "Grüße, €100 = viel\r\n".encode() * 20
    assert decode(base64.encodebytes(text), "base64") == (text, False, ())
    assert decode(quopri.encodestring(text), "quoted-printable") == (text, False, ())


@pytest.mark.parametrize("cte", ["", "7bit", "8bit", "binary"])
def test_identity_encodings(cte: str) -> None:
    assert decode(b"as is\r\n", cte) == (b"as is\r\n", False, ())


def test_unknown_encoding_is_read_as_is_with_a_note() -> None:
    assert decode(b"data", "x-uuencode") == (
        b"data", False, ("unknown Content-Transfer-Encoding 'x-uuencode' in part 1; "
                         "read as is",))


def test_damaged_base64_is_decoded_as_far_as_possible_with_a_note() -> None:
    data, cut, notes = decode(b"SGVs!bG8g\r\nV29y*bGQ=", "base64")
    assert (data, cut) == (b"Hello World", False)
    assert notes == ("invalid base64 in part 1; decoded what was readable",)


def test_a_missing_pad_is_repaired_silently() -> None:
    assert decode(b"SGk", "base64") == (b"Hi", False, ())


def test_invalid_quoted_printable_is_kept_with_a_note() -> None:
    data, cut, notes = decode(b"a=ZZb=3Dc", "quoted-printable")
    assert (data, cut) == (b"a=ZZb=c", False)
    assert notes == ("invalid quoted-printable in part 1; kept undecodable sequences "
                     "as they are",)


def test_large_parts_are_sliced_before_decoding() -> None:
    text = b"x" * 100_000
    for cte, encoded in (("base64", base64.encodebytes(text)),
                         ("quoted-printable", quopri.encodestring(text)),
                         ("8bit", text)):
        data, cut, notes = decode(encoded, cte, limit=1000)
        assert cut, cte
        # About the limit, never the whole part; and only what the part holds.
        assert 1000 <= len(data) <= 3000, cte
        assert data == b"x" * len(data), cte
        assert notes == (), cte


def test_repair_base64_decodes_concatenated_runs_and_drops_a_dangling_character() -> None:
    joined = base64.b64encode(b"one") + base64.b64encode(b"tw") + b"A"
    assert repair_base64(joined) == b"onetw"
    assert repair_base64(b"") == b""
    assert repair_base64(b"!!!") == b""
