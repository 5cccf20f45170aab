"""Property tests of MIME parsing: whatever the bytes, ``parse_message``
returns a well-formed document or raises ``MimeError``; nothing else ever
escapes. Plus round trips of what the stdlib encoders produce."""

from __future__ import annotations

import base64
import binascii
import email.header
import email.utils
import os
from dataclasses import dataclass

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from nexarch_events.mail.mime import (
    DEFAULT_MAX_TEXT_CHARS,
    MimeError,
    ParsedMessage,
    parse_message,
    to_index_document,
)
from tests.support.mailgen import realistic_messages
from tests.unit.test_mime import NOW, assert_well_formed

#: Examples per property; MIME_PROPERTY_EXAMPLES=5000 for a thorough hunt.
EXAMPLES = int(os.environ.get("MIME_PROPERTY_EXAMPLES", "150"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
#: Random MIME trees are slow to generate (recursive strategies).
TREES = settings(PROPERTY, max_examples=max(EXAMPLES * 2 // 3, 1))


def outcome(raw: bytes, max_text_chars: int = DEFAULT_MAX_TEXT_CHARS) -> ParsedMessage | None:
    """The document, or None for a MimeError; any other exception fails."""
    try:
        parsed = parse_message(raw, max_text_chars=max_text_chars, now=NOW)
    except MimeError as exc:
        # The parser's last-resort wrapper says "unexpected": that is a bug.
        assert "unexpected error" not in str(exc), exc
        assert str(exc)
        return None
    assert_well_formed(parsed, max_text_chars)
    to_index_document(parsed, archive_id=1, tenant_slug="t", size_bytes=len(raw))
    return parsed


# --------------------------------------------------------------------------
# Any bytes


@PROPERTY
@given(st.binary(max_size=3000), st.integers(1, 200))
def test_any_bytes(raw: bytes, cap: int) -> None:
    outcome(raw, cap)


@PROPERTY
@given(st.binary(max_size=3000))
def test_any_bytes_after_a_valid_header(raw: bytes) -> None:
    assert outcome(b"Subject: x\r\nContent-Type: text/plain\r\n" + raw) is not None


# --------------------------------------------------------------------------
# Bytes spliced into messages

FRAGMENTS = [
    b"\r\n", b"\n", b"\r", b"\r\n\r\n", b"\x00", b"\xff", b"\xc3", b"\xe2\x82", b" ", b"\t",
    b"=?", b"?=", b"=?utf-8?b?", b"=?utf-8?q?", b"=?x-foo?q?", b"=?utf-7?q?+2D0-?=",
    b"=?utf-8?B?w6Q=?=", b"=C3=A4", b"=", b"=\r\n", b"_", b"?",
    b"--", b"--b", b"--b--", b"--c", b"boundary=b", b"boundary=\"", b"charset=", b"name=",
    b"filename*0*=utf-8''%C3", b"filename*1=x", b"*=", b"'", b"%", b"%ZZ",
    b":", b";", b",", b'"', b"\\", b"<", b">", b"(", b")", b"@", b"group:", b";",
    b"Content-Type: multipart/mixed; boundary=b\r\n", b"Content-Type: message/rfc822\r\n",
    b"Content-Transfer-Encoding: base64\r\n", b"Content-Type: text/html\r\n",
    b"<script>", b"</p>", b"<!--", b"&#", b"&#xD800;", b"&amp;", b"<a href='",
    b"Mon, 1 Jan 1601 00:00:00 +0000", b"99:99:99", b"+9999", b"2099",
]
noise = st.lists(st.one_of(st.binary(max_size=12), st.sampled_from(FRAGMENTS)),
                 max_size=10).map(b"".join)


def either(*good: bytes) -> st.SearchStrategy[bytes]:
    return st.one_of(st.sampled_from(good), noise)


TEMPLATE = (
    b"From: {from_}\r\nTo: {to}\r\nCc: {cc}\r\nSubject: {subject}\r\nDate: {date}\r\n"
    b"Message-ID: {mid}\r\nContent-Type: multipart/{sub}; boundary=\"{b}\"\r\n{extra}\r\n"
    b"{preamble}--{b}\r\n"
    b"Content-Type: text/{t}; charset={cs}{params}\r\n"
    b"Content-Transfer-Encoding: {cte}\r\nContent-Disposition: {disp}\r\n\r\n{body1}\r\n"
    b"--{b2}\r\nContent-Type: {ct2}\r\nContent-Transfer-Encoding: {cte2}\r\n\r\n{body2}\r\n"
    b"--{b}{close}{epilogue}"
)


@PROPERTY
@given(st.fixed_dictionaries({
    "from_": either(b"Anna <a@example.org>", b"=?utf-8?q?J=C3=BCrgen?= <j@x.de>",
                    b'"Last, First" <f@x.org>, b@y'),
    "to": either(b"b@example.org", b"team: a@b, c@d;", b"(comment) x@y"),
    "cc": either(b"", b"c@example.org"),
    "subject": either(b"=?utf-8?B?UmVjaG51bmdlbg==?=", b"plain", b"=?iso-8859-1?q?H=E4?="),
    "date": either(b"Tue, 13 Jun 2023 10:00:00 +0200", b"13 Jun 2023 10:00"),
    "mid": either(b"<m@x>"),
    "sub": either(b"mixed", b"alternative", b"digest", b"related"),
    "b": either(b"b", b"=_Part_1", b"b--x"),
    "b2": either(b"b", b"c"),
    "extra": either(b"", b"MIME-Version: 1.0\r\n"),
    "preamble": either(b"", b"preamble\r\n"),
    "t": either(b"plain", b"html", b"csv"),
    "cs": either(b"utf-8", b"iso-8859-1", b"utf-16", b"utf-7", b"x-foo", b"zlib", b'""'),
    "params": either(b"", b"; name=a.txt", b"; format=flowed"),
    "cte": either(b"7bit", b"base64", b"quoted-printable", b"x-uue"),
    "disp": either(b"inline", b"attachment; filename=\"f.txt\"",
                   b"attachment; filename*=utf-8''%C3%A4.txt"),
    "body1": either(b"Hello", base64.encodebytes("Grüße".encode()), b"Gr=C3=BC=C3=9Fe"),
    "ct2": either(b"text/plain", b"text/html", b"application/pdf", b"message/rfc822",
                  b"multipart/mixed; boundary=c"),
    "cte2": either(b"7bit", b"base64"),
    "body2": either(b"<p>html &amp; text</p>", b"Subject: inner\r\n\r\ninner body", b"AAAA"),
    "close": either(b"--", b""),
    "epilogue": either(b"", b"\r\nepilogue"),
}), st.integers(1, 100))
def test_spliced_template(values: dict[str, bytes], cap: int) -> None:
    raw = TEMPLATE
    for key, value in values.items():
        raw = raw.replace(b"{" + key.encode() + b"}", value)
    assert outcome(raw) is not None  # headers come first: always a document
    outcome(raw, cap)


@PROPERTY
@given(st.lists(st.one_of(noise, st.sampled_from(FRAGMENTS)), max_size=40).map(b"".join))
def test_fragment_soup(raw: bytes) -> None:
    outcome(raw)
    outcome(raw, 3)


# --------------------------------------------------------------------------
# Realistic messages, damaged

REALISTIC = list(realistic_messages(24, seed=7))


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    raw = bytearray(draw(st.sampled_from(REALISTIC)))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(raw)))
        action = draw(st.sampled_from(["insert", "delete", "truncate", "flip"]))
        if action == "insert":
            raw[at:at] = draw(st.one_of(noise, st.sampled_from(FRAGMENTS)))
        elif action == "delete":
            del raw[at:at + draw(st.integers(1, 200))]
        elif action == "truncate":
            del raw[at:]
        elif at < len(raw):
            raw[at] ^= draw(st.integers(1, 255))
    return bytes(raw)


@PROPERTY
@given(damaged(), st.integers(1, 300))
def test_damaged_realistic_messages(raw: bytes, cap: int) -> None:
    outcome(raw)
    outcome(raw, cap)


# --------------------------------------------------------------------------
# Random MIME trees


@dataclass
class Leaf:
    headers: list[bytes]
    body: bytes


@dataclass
class Multi:
    headers: list[bytes]
    subtype: bytes
    boundary: bytes
    children: list[Leaf | Multi]
    close: bool


def render(node: Leaf | Multi) -> bytes:
    if isinstance(node, Leaf):
        return b"\r\n".join(node.headers) + b"\r\n\r\n" + node.body
    head = [*node.headers,
            b"Content-Type: multipart/" + node.subtype + b'; boundary="' + node.boundary + b'"']
    body = b"".join(b"--" + node.boundary + b"\r\n" + render(child) + b"\r\n"
                    for child in node.children)
    if node.close:
        body += b"--" + node.boundary + b"--\r\n"
    return b"\r\n".join(head) + b"\r\n\r\n" + body


header_lines = st.lists(st.one_of(
    st.sampled_from([b"Content-Type: text/plain; charset=utf-8", b"Content-Type: text/html",
                     b"Content-Type: text/plain; charset=utf-16",
                     b"Content-Type: application/octet-stream; name=x.bin",
                     b"Content-Type: message/rfc822", b"Content-Transfer-Encoding: base64",
                     b"Content-Transfer-Encoding: quoted-printable",
                     b"Content-Disposition: attachment; filename=a.txt",
                     b"Content-Type: text/plain; charset=x-unknown"]),
    noise.map(lambda value: b"Content-Type: " + value),
    noise.map(lambda value: b"Content-Disposition: " + value),
    noise.map(lambda value: b"X-Noise: " + value)), max_size=4)
leaves = st.builds(Leaf, header_lines, st.one_of(
    noise, st.text(max_size=50).map(lambda text: text.encode("utf-8", "surrogatepass")),
    st.binary(max_size=60).map(base64.encodebytes)))
trees = st.recursive(leaves, lambda children: st.builds(
    Multi, header_lines, st.sampled_from([b"mixed", b"alternative", b"digest"]),
    st.sampled_from([b"a", b"b", b"a-1", b"=_x"]), st.lists(children, max_size=4), st.booleans()),
    max_leaves=12)


@TREES
@given(trees, st.integers(1, 50))
def test_random_mime_trees(tree: Leaf | Multi, cap: int) -> None:
    raw = b"From: a@example.org\r\nSubject: tree\r\n" + render(tree)
    assert outcome(raw) is not None
    assert outcome(raw, cap) is not None


# --------------------------------------------------------------------------
# Round trips

CHARSETS = ["utf-8", "utf-16", "windows-1252", "koi8-r", "iso-2022-jp", "gb18030", "utf-7"]
printable = st.characters(blacklist_categories=("Cs", "Cc"))


@PROPERTY
@given(st.text(printable, max_size=200), st.sampled_from(CHARSETS),
       st.sampled_from(["base64", "quoted-printable", "8bit"]))
def test_body_round_trip(text: str, charset: str, cte: str) -> None:
    try:
        data = text.encode(charset)
    except UnicodeEncodeError:
        assume(False)
    if cte == "base64":
        encoded = base64.encodebytes(data)
    elif cte == "quoted-printable":
        encoded = binascii.b2a_qp(data, istext=False)
    else:
        encoded = data
    raw = (f"Subject: x\r\nContent-Type: text/plain; charset={charset}\r\n"
           f"Content-Transfer-Encoding: {cte}\r\n\r\n").encode() + encoded
    parsed = outcome(raw)
    assert parsed is not None
    assert parsed.body == ("" if text.isspace() else text)  # blank text is no body
    assert parsed.notes == ()


@PROPERTY
@given(st.text(printable, min_size=1, max_size=120), st.sampled_from(["utf-8", "iso-8859-1"]))
def test_subject_round_trip(text: str, charset: str) -> None:
    assume("=?" not in text)
    try:
        encoded = email.header.Header(text, charset).encode()
    except UnicodeEncodeError:
        assume(False)
    parsed = outcome(b"Subject: " + encoded.encode("ascii") + b"\r\n\r\nbody")
    assert parsed is not None
    assert parsed.subject == " ".join(text.split())


@PROPERTY
@given(st.lists(st.tuples(
    st.text(printable, max_size=30),
    st.from_regex(r"[a-z0-9][a-z0-9.+_-]{0,10}@[a-z0-9-]{1,10}\.(org|de)", fullmatch=True)),
    min_size=1, max_size=5))
def test_address_round_trip(addresses: list[tuple[str, str]]) -> None:
    assume(all("=?" not in name for name, _ in addresses))
    header = ", ".join(email.utils.formataddr((name, address), charset="utf-8")
                       for name, address in addresses)
    parsed = outcome(b"To: " + header.encode("ascii") + b"\r\n\r\nbody")
    assert parsed is not None
    assert [(a.name, a.address) for a in parsed.to] == \
        [(" ".join(name.split()), address) for name, address in addresses]
