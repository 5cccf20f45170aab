"""Bytes in a declared charset to text: which label means which codec, and
what happens when the label is unknown or wrong (UTF-8, else windows-1252,
with a note). Used for bodies, RFC 2047 encoded words and RFC 2231
parameters alike.

Decoded text never holds lone surrogates: the codecs that can produce them
(UTF-7 and the like) have their output cleaned."""

from __future__ import annotations

import codecs
import encodings
import encodings.aliases
import functools
import pkgutil
import re
from dataclasses import dataclass

from .notes import Notes, clean, quote

__all__ = ["Codec", "codec", "decode_strict", "decode_text", "fallback_decode"]

_UTF8_SEQUENCE = re.compile(
    rb"[\xc2-\xdf][\x80-\xbf]|[\xe0-\xef][\x80-\xbf]{2}|[\xf0-\xf4][\x80-\xbf]{3}")
_HIGH_BYTES = bytes(range(128))  # translate(None, this) keeps bytes >= 0x80


def _latin1_fallback(exc: UnicodeError) -> tuple[str, int]:
    # windows-1252 leaves five bytes undefined; read them as ISO-8859-1 does.
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    return exc.object[exc.start:exc.end].decode("latin-1"), exc.end


#: The error handler for windows-1252 (see _latin1_fallback).
LATIN1_FALLBACK = "nexarch-latin1"
codecs.register_error(LATIN1_FALLBACK, _latin1_fallback)

#: Labels decoded with the superset mail clients actually mean (as WHATWG
#: does for the web). "us-ascii"/"ascii" with 8-bit bytes get the fallbacks.
_SUPERSETS = {
    "iso-8859-1": "cp1252", "iso8859-1": "cp1252", "iso_8859-1": "cp1252",
    "latin1": "cp1252", "latin-1": "cp1252", "l1": "cp1252", "cp819": "cp1252",
    "iso-8859-9": "cp1254", "latin5": "cp1254", "tis-620": "cp874",
    "gb2312": "gb18030", "gbk": "gb18030", "x-gbk": "gb18030", "euc-cn": "gb18030",
    "euc-kr": "cp949", "ks_c_5601-1987": "cp949", "ks_c_5601": "cp949",
    "shift_jis": "cp932", "shift-jis": "cp932", "sjis": "cp932", "x-sjis": "cp932",
    "big5": "big5hkscs", "utf8": "utf-8", "unicode-1-1-utf-8": "utf-8",
}
#: Labels that say "unknown" in so many words: the fallbacks apply, no note.
_NO_CHARSET = frozenset({"", "us-ascii", "ascii", "x-unknown", "unknown", "unknown-8bit",
                         "x-user-defined", "default", "none", "charset"})
#: Python codecs that are not mail charsets (escape decoders, DNS codecs, and
#: ones that always fail); "zlib", "base64" etc. are refused as non-text.
_REFUSED_CODECS = frozenset({"unicode-escape", "raw-unicode-escape", "punycode", "idna",
                             "undefined", "charmap", "mbcs", "oem"})
_SURROGATE_FREE = frozenset({
    "utf-8", "ascii", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be",
    "gb18030", "gbk", "big5hkscs", "big5", "euc_jp", "euc_kr", "shift_jis", "iso2022_jp",
    "iso2022_kr", "johab", "hz", "tis-620"})
_SURROGATE_FREE_PREFIXES = ("iso8859-", "cp", "mac-", "koi8-", "latin")
#: Decodes as ASCII only in a charset where pure-ASCII bytes are ASCII text:
#: "+" shifts UTF-7, "~{" shifts HZ, ESC $ B shifts ISO-2022-JP.
_ASCII_PROBE = b"Az09 -=.:/\n+AGE- ~{x~} \x1b$B$\"\x1b(B"


@dataclass(frozen=True, slots=True)
class Codec:
    name: str
    #: Pure-ASCII bytes decode to the same text (false for UTF-7/16/32).
    ascii_compatible: bool
    #: Strict decoding never yields lone surrogates (UTF-7 does): checked
    #: for the charsets mail uses; the rest are cleaned after decoding.
    surrogate_free: bool


@functools.lru_cache(maxsize=256)
def codec(label: str) -> Codec | None:
    """The codec a lower-case charset label means, or None if Python has
    none or it is not a text charset."""
    name = _SUPERSETS.get(label, label)
    if not _known(name):
        return None
    try:
        info = codecs.lookup(name)
    except (LookupError, ValueError, TypeError):
        return None
    if info.name in _REFUSED_CODECS:
        return None
    try:
        compatible = _ASCII_PROBE.decode(info.name) == _ASCII_PROBE.decode("ascii")
    except LookupError:
        return None  # a bytes-to-bytes codec: "zlib", "base64", "rot13", ...
    except ValueError:
        compatible = False  # UTF-16, UTF-32: the probe is not even valid
    return Codec(info.name, compatible,
                 info.name in _SURROGATE_FREE or info.name.startswith(_SURROGATE_FREE_PREFIXES))


@functools.cache
def _codec_names() -> frozenset[str]:
    """What the standard library's codec search can find: its modules and
    their aliases, in encodings.normalize_encoding's form."""
    modules = {m.name for m in pkgutil.iter_modules(encodings.__path__)}
    return frozenset(modules | set(encodings.aliases.aliases))


def _known(name: str) -> bool:
    """Whether ``name`` can name a standard codec. codecs.lookup of any
    other name tries an import and keeps the miss for the life of the
    process: one message with thousands of made-up charset names took
    seconds and left megabytes behind (a fuzzing audit)."""
    norm = encodings.normalize_encoding(name.lower().replace(" ", "-"))
    names = _codec_names()
    return norm in names or norm.replace(".", "_") in names


def decode_strict(data: bytes, name: str, final: bool) -> str:
    """Strict decoding (windows-1252 excepted, whose five holes read as
    ISO-8859-1); ``final=False`` drops an incomplete last character."""
    errors = LATIN1_FALLBACK if name == "cp1252" else "strict"
    if final:
        return data.decode(name, errors)
    return codecs.getincrementaldecoder(name)(errors).decode(data, final=False)


def decode_text(data: bytes, charset: str, where: str, notes: Notes,
                final: bool = True) -> str:
    """Bytes in a declared charset as text. Unknown or wrong charsets fall
    back to UTF-8, else windows-1252; a note says which. ``final=False``:
    the data was cut, an incomplete last character is dropped."""
    label = charset.strip().strip("\"'").lower()
    found = None
    unknown = False
    if label not in _NO_CHARSET:
        found = codec(label) if len(label) <= 64 else None
        unknown = found is None
    if (found is None or found.ascii_compatible) and data.isascii():
        return data.decode("ascii")
    text = None
    if found is not None:
        try:
            text = decode_strict(data, found.name, final)
        except (ValueError, LookupError, TypeError):
            pass
        else:
            if not found.surrogate_free:
                text = clean(text)
    if text is None:
        text, used = fallback_decode(data, final)
        if unknown:
            notes.add(f"unknown charset {quote(label)} in {where}, decoded as {used}")
        elif found is not None:
            notes.add(f"{where} is not valid {label}; decoded as {used}")
        elif used != "UTF-8":
            notes.add(f"{where} has 8-bit text but no charset; decoded as {used}")
    return text


def fallback_decode(data: bytes, final: bool) -> tuple[str, str]:
    """UTF-8 if valid, else UTF-8 with replacement if it is mostly UTF-8
    (damaged), else windows-1252 (mislabelled Latin text, which has next
    to no valid UTF-8 sequences). Returns (text, what was used)."""
    try:
        return decode_strict(data, "utf-8", final), "UTF-8"
    except ValueError:
        pass
    valid = sum(len(s) for s in _UTF8_SEQUENCE.findall(data))
    high = len(data.translate(None, _HIGH_BYTES))
    if valid * 2 >= high:
        return data.decode("utf-8", "replace"), "UTF-8 with replacement"
    return data.decode("cp1252", LATIN1_FALLBACK), "windows-1252"
