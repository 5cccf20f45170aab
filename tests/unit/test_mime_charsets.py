"""mail/mime/charsets.py: charset labels to codecs, and the fallbacks."""

from __future__ import annotations

import pytest

from nexarch_events.mail.mime.charsets import codec, decode_text, fallback_decode
from nexarch_events.mail.mime.notes import Notes


def decode(data: bytes, charset: str, final: bool = True) -> tuple[str, tuple[str, ...]]:
    notes = Notes()
    return decode_text(data, charset, "part 1", notes, final), notes.result()


@pytest.mark.parametrize(("label", "name"), [
    ("iso-8859-1", "cp1252"),    # what mailers mean by Latin-1
    ("gb2312", "gb18030"),
    ("shift_jis", "cp932"),
    ("utf8", "utf-8"),
    ("koi8-r", "koi8-r"),
])
def test_labels_map_to_the_superset_codecs(label: str, name: str) -> None:
    found = codec(label)
    assert found is not None
    assert found.name == name


@pytest.mark.parametrize("label", ["base64", "zlib", "rot13", "idna", "unicode-escape",
                                   "no-such-charset"])
def test_non_text_and_unknown_codecs_are_refused(label: str) -> None:
    assert codec(label) is None


def test_ascii_compatibility_and_surrogate_safety() -> None:
    utf7, utf16, latin = codec("utf-7"), codec("utf-16"), codec("latin1")
    assert utf7 is not None and utf16 is not None and latin is not None
    assert (utf7.ascii_compatible, utf7.surrogate_free) == (False, False)
    assert (utf16.ascii_compatible, utf16.surrogate_free) == (False, True)
    assert (latin.ascii_compatible, latin.surrogate_free) == (True, True)


def test_declared_charset_is_honoured() -> None:
    assert decode("Grüße".encode("iso-8859-15"), '"ISO-8859-15"') == ("Grüße", ())
    assert decode(b"\x80 \x81", "iso-8859-1") == ("€ \x81", ())  # 0x81: cp1252 hole
    assert decode("Привет".encode("koi8-r"), "koi8-r") == ("Привет", ())


def test_ascii_only_data_in_an_incompatible_charset_is_still_decoded_by_it() -> None:
    assert decode(b"a+AOQ-", "utf-7") == ("aä", ())
    assert decode(b"a+AOQ-", "utf-8") == ("a+AOQ-", ())


def test_utf7_lone_surrogates_are_removed() -> None:
    assert b"a+2D0-b".decode("utf-7") == "a\ud83db"  # a lone high surrogate
    assert decode(b"a+2D0-b", "utf-7") == ("a?b", ())
    assert decode(b"+2D3cAA-", "utf-7") == ("\U0001f400", ())  # a pair is fine


def test_wrong_charset_falls_back_with_a_note() -> None:
    assert decode("Grüße".encode(), "us-ascii") == ("Grüße", ())
    assert decode("Grüße".encode(), "iso-2022-jp") == (
        "Grüße", ("part 1 is not valid iso-2022-jp; decoded as UTF-8",))
    assert decode("Grüße".encode("cp1252"), "") == (
        "Grüße", ("part 1 has 8-bit text but no charset; decoded as windows-1252",))
    assert decode("Grüße".encode(), "x-klingon") == (
        "Grüße", ("unknown charset 'x-klingon' in part 1, decoded as UTF-8",))


def test_cut_data_drops_an_incomplete_last_character() -> None:
    assert decode("aä".encode()[:-1], "utf-8", final=False) == ("a", ())


@pytest.mark.parametrize(("data", "expected"), [
    ("Grüße".encode(), ("Grüße", "UTF-8")),
    ("Grüße ".encode() * 10 + b"\xff", ("Grüße " * 10 + "\ufffd", "UTF-8 with replacement")),
    ("Grüße".encode("cp1252"), ("Grüße", "windows-1252")),
])
def test_fallback_decode(data: bytes, expected: tuple[str, str]) -> None:
    assert fallback_decode(data, True) == expected


def test_made_up_charset_names_are_not_looked_up() -> None:
    """codecs.lookup of an unknown name tries an import and keeps the miss
    for the life of the process: 4,400 made-up names in one message took
    seconds and left megabytes behind (a fuzzing audit). Only names a
    standard codec answers to are looked up."""
    import encodings

    from nexarch_events.mail.mime.charsets import codec

    before = len(encodings._cache)  # type: ignore[attr-defined]
    for n in range(2_000):
        assert codec(f"x-made-up-{n}") is None
    assert len(encodings._cache) - before == 0  # type: ignore[attr-defined]
    for label in ("utf-8", "utf8", "iso-8859-15", "windows-1258", "ks_c_5601-1987",
                  "unicode-1-1-utf-7", "ansi_x3.4-1968", "shift_jis", "gb2312"):
        assert codec(label) is not None, label
