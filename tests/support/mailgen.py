"""Mail generators for tests and benchmarks.

- ``hostile_messages()``: (name, raw) pairs of messages that break naive
  parsers: malformed MIME, bad charsets, NUL bytes, 8-bit headers, absurd
  dates, 50 MB attachments, deep nesting, 10,000 parts, empty input, ...
  Each is something a real server could deliver. Built once per process
  (about 110 MB, mostly the two 50 MB messages) and cached.
- ``realistic_messages(n, seed)``: n deterministic messages of 2-50 KB in
  German and English: plain, multipart/alternative with HTML, HTML only,
  text and binary attachments, forwarded messages; RFC 2047 subjects and
  names; utf-8, iso-8859-1 and windows-1252. Message i's body holds the
  word ``unique_token(i)`` ("uniq42x") and no other message's token, so a
  search for it finds exactly that message; ``start`` numbers further
  batches on (tokens depend on the number only, not on the seed).
- ``many_parts(n)``: a multipart with n small named text parts.

Only the standard library; no I/O.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
import random
import re
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

__all__ = [
    "HUGE_SIZE",
    "MANY_PARTS",
    "MAX_REALISTIC_SIZE",
    "MIN_REALISTIC_SIZE",
    "NESTED_DEEP",
    "NESTED_VERY_DEEP",
    "hostile_message",
    "hostile_messages",
    "many_parts",
    "realistic_messages",
    "unique_token",
]

#: Size of the 50 MB attachments' content (bytes before transfer encoding
#: for the text one; bytes of base64 for the binary one).
HUGE_SIZE = 50 * 1024 * 1024
NESTED_DEEP = 100
NESTED_VERY_DEEP = 10_000
MANY_PARTS = 10_000
MIN_REALISTIC_SIZE = 2 * 1024
MAX_REALISTIC_SIZE = 50 * 1024
CRLF = b"\r\n"


def unique_token(n: int) -> str:
    """The word only message n's body contains: searching for it finds it."""
    return f"uniq{n}x"


# --------------------------------------------------------------------------
# Realistic mail

_DE_WORDS = (
    "Rechnung Rechnungen Haus Häuser Hauses Kunde Kunden Angebot Angebote Termin Termine "
    "Besprechung Besprechungen Vertrag Verträge Lieferung Lieferungen Bestellung "
    "Bestellungen Zahlung Zahlungen Mitarbeiter Mitarbeiterin Abteilung Projekt Projekte "
    "Unterlagen Anhang Frage Fragen Antwort Woche Wochen Monat Jahres Büro Straße "
    "Schlüssel Größe Prüfung Prüfungen Übersicht Änderung Änderungen Gebäude Grundstück "
    "gestern heute morgen nächste letzten schnell pünktlich freundlich offen geschlossen "
    "bitte danke gern leider natürlich übermorgen außerdem deshalb trotzdem während "
    "schicke schickt geschickt bestätige bestätigt prüfen geprüft laufen läuft gelaufen "
    "bezahlen bezahlt bezahlte vereinbart vereinbarten gesendet erhalten erhielt "
    "und oder aber mit für über unter nach vor bei von zum zur der die das den dem des "
    "ein eine einen einem ist sind war waren wird werden hat haben hatte können müssen "
    "sollten würde Grüße Gruß Liebe Lieber Herr Frau Kollegen Kolleginnen Team"
).split()
_EN_WORDS = (
    "invoice invoices house houses customer customers offer offers meeting meetings "
    "contract contracts delivery deliveries order orders payment payments employee "
    "department project projects documents attachment question questions answer week "
    "weeks month year office street key size review reviews overview change changes "
    "building property running runs ran run walked walking shipped shipping shipment "
    "yesterday today tomorrow next last quickly friendly open closed please thanks "
    "unfortunately of course also therefore anyway while send sends sent confirm "
    "confirmed check checked pay paid agreed received and or but with for over under "
    "after before at from to the a an is are was were will be has have had can must "
    "should would regards best dear team colleagues schedule scheduled updates updated"
).split()
_FIRST = ("Anna Jürgen Björn Käthe Özlem Stefan Maria Jörg Lena Lukas Sophie Müge "
          "Peter John Mary Olivia James Emma Noah Zoë Renée François").split()
_LAST = ("Müller Schmidt Schäfer Weiß Groß Köhler Böhm Meyer Fischer Wagner Becker "
         "Smith Jones Brown Taylor Wilson O'Brien Nuñez").split()
_DOMAINS = ("example.org", "example.com", "beispiel.de", "firma.example.de",
            "mail.example.net", "Example.ORG")
_CHARSETS = ("utf-8", "utf-8", "utf-8", "iso-8859-1", "windows-1252")


def _words(rng: random.Random, german: bool, count: int) -> list[str]:
    return rng.choices(_DE_WORDS if german else _EN_WORDS, k=count)


def _paragraphs(rng: random.Random, german: bool, size: int, token: str) -> list[str]:
    """Paragraphs of about ``size`` characters; the token is in the first."""
    paragraphs: list[str] = []
    total = 0
    while total < size:
        sentences = []
        for _ in range(rng.randint(2, 6)):
            words = _words(rng, german, rng.randint(5, 18))
            words[0] = words[0].capitalize()
            sentences.append(" ".join(words) + rng.choice(".....?!"))
        paragraph = " ".join(sentences)
        if not paragraphs:
            paragraph = f"{paragraph} Referenz {token}." if german else \
                f"{paragraph} Reference {token}."
        paragraphs.append(paragraph)
        total += len(paragraph) + 2
    return paragraphs


_LINE = re.compile(r"(.{1,72})(?: |$)")


def _wrap(paragraph: str) -> str:
    """Lines of at most 72 characters (words are short)."""
    return "\n".join(_LINE.findall(paragraph))


def _encoded_word(text: str, charset: str, rng: random.Random) -> str:
    """RFC 2047 encoded-words (B or Q), split without cutting characters."""
    if text.isascii():
        return text
    mode = rng.choice("BQ")
    words = []
    for start in range(0, len(text), 15):
        data = text[start:start + 15].encode(charset)
        if mode == "B":
            words.append(f"=?{charset}?B?{base64.b64encode(data).decode()}?=")
        else:
            q = "".join(chr(b) if (chr(b).isalnum() and b < 128) else
                        ("_" if b == 32 else f"={b:02X}") for b in data)
            words.append(f"=?{charset}?Q?{q}?=")
    return "\r\n ".join(words)


def _address(rng: random.Random, charset: str, name_charset_ok: bool = True) -> str:
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    local = f"{first}.{last}".encode("ascii", "ignore").decode() or "someone"
    address = f"{local.replace(' ', '')}@{rng.choice(_DOMAINS)}"
    style = rng.randrange(4)
    if style == 0:
        return address
    name = f"{last}, {first}" if style == 1 else f"{first} {last}"
    try:
        name.encode(charset)
    except UnicodeEncodeError:
        charset = "utf-8"
    if not name.isascii() and name_charset_ok:
        return f"{_encoded_word(name, charset, rng)} <{address}>"
    if "," in name or "'" in name:
        return f'"{name}" <{address}>'
    return f"{name} <{address}>"


def _rfc2231(value: str) -> str:
    """An RFC 2231 extended parameter value: utf-8''percent-encoded."""
    return "utf-8''" + "".join(
        c if (c.isascii() and c.isalnum()) or c in "._-" else
        "".join(f"%{b:02X}" for b in c.encode()) for c in value)


def _qp(data: bytes) -> bytes:
    data = data.replace(b"\r\n", b"\n")
    return binascii.b2a_qp(data, istext=True, header=False).replace(b"\n", b"\r\n")


def _b64(data: bytes) -> bytes:
    return base64.encodebytes(data).replace(b"\n", b"\r\n")


def _text_part(text: str, charset: str, rng: random.Random, subtype: str = "plain",
               extra: str = "") -> list[str | bytes]:
    """Header lines and the encoded body of one text part (as pieces)."""
    data = text.replace("\n", "\r\n").encode(charset)
    cte = rng.choice(("8bit", "quoted-printable", "quoted-printable", "base64")) \
        if not data.isascii() else rng.choice(("7bit", "7bit", "quoted-printable"))
    if cte == "quoted-printable":
        body = _qp(data)
    elif cte == "base64":
        body = _b64(data)
    else:
        body = data
    return [f"Content-Type: text/{subtype}; charset=\"{charset}\"{extra}",
            f"Content-Transfer-Encoding: {cte}", "", body]


def _html(paragraphs: list[str], rng: random.Random, german: bool) -> str:
    body = []
    for paragraph in paragraphs:
        if rng.random() < 0.3:
            words = paragraph.split(" ")
            i = rng.randrange(len(words))
            words[i] = f'<a href="https://www.example.org/{i}">{words[i]}</a>'
            paragraph = " ".join(words)
        if german and rng.random() < 0.3:
            paragraph = paragraph.replace("ü", "&uuml;")
        body.append(f"<p>{paragraph}</p>")
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>Mail</title>"
            "<style>p { margin: 0 } .x { color: red }</style></head>\n<body>\n"
            + "\n".join(body) + "\n<div><b>--</b><br>Team</div></body></html>")


def _multipart(subtype: str, parts: list[list[str | bytes]], boundary: str,
               extra_headers: list[str] | None = None) -> list[str | bytes]:
    pieces: list[str | bytes] = [*(extra_headers or []),
                                 f'Content-Type: multipart/{subtype}; boundary="{boundary}"',
                                 "", "This is a multi-part message in MIME format."]
    for part in parts:
        pieces.append(f"--{boundary}")
        pieces.extend(part)
    pieces.append(f"--{boundary}--")
    pieces.append("")
    return pieces


def _join(pieces: list[str | bytes], eol: bytes) -> bytes:
    out = []
    for piece in pieces:
        if isinstance(piece, str):
            out.append(piece.replace("\r\n", eol.decode()).encode("ascii") + eol)
        else:
            data = piece if eol == CRLF else piece.replace(CRLF, eol)
            out.append(data if data.endswith(eol) else data + eol)
    return b"".join(out)


def _realistic(n: int, rng: random.Random, scale: float = 1.0) -> bytes:
    german = rng.random() < 0.5
    charset = rng.choice(_CHARSETS)
    token = unique_token(n)
    kind = rng.choices(("plain", "alternative", "mixed-binary", "mixed-text", "html",
                        "forward"), weights=(30, 30, 15, 10, 10, 5))[0]
    target = int(math.exp(rng.uniform(math.log(2_500), math.log(40_000))) * scale)
    attachment_share = rng.uniform(0.3, 0.7) if kind in ("mixed-binary", "forward") else 0.0
    if kind == "mixed-text":
        attachment_share = 0.3
    text_size = int(target * (1 - attachment_share))
    if kind == "alternative":
        text_size //= 2
    paragraphs = _paragraphs(rng, german, max(text_size - 900, 300), token)
    text = "\n\n".join(_wrap(p) for p in paragraphs)
    greeting = ("Hallo zusammen,\n\n" if german else "Hi all,\n\n")
    sign = ("\n\nViele Grüße\nJörg" if german else "\n\nBest regards\nJoe")
    text = greeting + text + sign
    if charset == "iso-8859-1":
        text = text.replace("€", "EUR")

    subject = " ".join(_words(rng, german, rng.randint(2, 8))).capitalize()
    if rng.random() < 0.3:
        subject = ("AW: " if german else "Re: ") + subject
    when = datetime(2015, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randrange(10 * 365 * 86400))
    zone = timezone(timedelta(hours=rng.choice((0, 1, 2, -5, -8, 9))))
    date = when.astimezone(zone).strftime("%a, %d %b %Y %H:%M:%S %z")
    headers: list[str | bytes] = [
        f"Return-Path: <bounce-{n}@example.net>",
        f"Received: from mx{n % 7}.example.net (mx.example.net [192.0.2.{n % 250}])\r\n"
        f"\tby imap.example.org with ESMTPS id {rng.getrandbits(48):x}; {date}",
        f"From: {_address(rng, charset)}",
        "To: " + ",\r\n ".join(_address(rng, charset) for _ in range(rng.randint(1, 4))),
    ]
    if rng.random() < 0.4:
        headers.append("Cc: " + ", ".join(_address(rng, charset)
                                          for _ in range(rng.randint(1, 3))))
    headers += [
        f"Subject: {_encoded_word(subject, charset, rng)}",
        f"Date: {date}",
        f"Message-ID: <{n}.{rng.getrandbits(40):x}@mailgen.example>",
        "MIME-Version: 1.0",
        f"X-Mailer: mailgen {rng.choice(('Outlook 16.0', 'Thunderbird 115', 'Apple Mail'))}",
    ]
    boundary = f"----=_Part_{n}_{rng.getrandbits(32):08x}"

    def alternative(inner_boundary: str) -> list[str | bytes]:
        html = _html(paragraphs, rng, german)
        return _multipart("alternative", [_text_part(text, charset, rng),
                                          _text_part(html, "utf-8", rng, "html")],
                          inner_boundary)

    if kind == "plain":
        body = _text_part(text, charset, rng)
    elif kind == "html":
        body = _text_part(_html(paragraphs, rng, german), "utf-8", rng, "html")
    elif kind == "alternative":
        body = alternative(boundary)
    elif kind == "mixed-binary":
        size = max(int(target * attachment_share * 0.72), 200)
        pdf = b"%PDF-1.4\n" + rng.randbytes(size)
        name = rng.choice(("Rechnung_2023-04.pdf", "invoice 42.pdf", "Übersicht.pdf",
                           "scan0001.pdf"))
        first = alternative(boundary + "_alt") if rng.random() < 0.5 else \
            _text_part(text, charset, rng)
        body = _multipart("mixed", [
            first,
            [f'Content-Type: application/pdf; name="{_encoded_word(name, "utf-8", rng)}"',
             "Content-Transfer-Encoding: base64",
             "Content-Disposition: attachment; filename*=" + _rfc2231(name),
             "", _b64(pdf)],
        ], boundary)
    elif kind == "mixed-text":
        rows = ["Datum;Betrag;Kunde" if german else "date,amount,customer"]
        for i in range(max(int(target * attachment_share) // 40, 3)):
            rows.append(f"2023-{i % 12 + 1:02d}-{i % 28 + 1:02d};{rng.randint(1, 9999)},"
                        f"{rng.randint(0, 99):02d};{rng.choice(_LAST)}")
        name = rng.choice(("Umsätze.csv", "report.csv", "Häuser-Liste.txt"))
        body = _multipart("mixed", [
            _text_part(text, charset, rng),
            _text_part("\n".join(rows), "utf-8", rng, "csv" if name.endswith("csv") else
                       "plain",
                       f";\r\n name=\"{_encoded_word(name, 'utf-8', rng)}\"\r\n"
                       "Content-Disposition: attachment;\r\n filename*=" + _rfc2231(name)),
        ], boundary)
    else:  # forward: a message/rfc822 attachment
        inner_text = "\n\n".join(_wrap(p) for p in _paragraphs(
            rng, german, max(int(target * attachment_share) - 600, 200), "weitergeleitet"
            if german else "forwarded"))
        inner = _join([
            f"From: {_address(rng, 'utf-8')}",
            f"To: {_address(rng, 'utf-8')}",
            f"Subject: {_encoded_word('Ursprüngliche Nachricht', 'utf-8', rng)}",
            f"Date: {date}",
            "MIME-Version: 1.0",
            *_text_part(inner_text, "utf-8", rng),
        ], CRLF)
        body = _multipart("mixed", [
            _text_part(text, charset, rng),
            ["Content-Type: message/rfc822", "Content-Disposition: inline", "", inner],
        ], boundary)
    eol = CRLF if rng.random() < 0.8 else b"\n"
    return _join([*headers, *body], eol)


def realistic_messages(n: int, seed: int = 0, start: int = 0) -> Iterator[bytes]:
    """Messages number start .. start+n-1 (2-50 KB each), deterministic:
    the same (number, seed) always gives the same bytes, and message i's
    body holds ``unique_token(i)``. Batches with different ``start`` never
    share a token; different seeds give different text, same tokens."""
    for number in range(start, start + n):
        scale = 1.0
        while True:
            raw = _realistic(number, random.Random(f"mailgen:{seed}:{number}"), scale)
            if len(raw) < MIN_REALISTIC_SIZE:
                scale *= 1.5
            elif len(raw) > MAX_REALISTIC_SIZE:
                scale *= 0.7
            else:
                yield raw
                break


# --------------------------------------------------------------------------
# Hostile mail

_HEAD = (b"From: Anna Muster <anna@example.org>\r\n"
         b"To: bob@example.org\r\n"
         b"Date: Tue, 13 Jun 2023 10:00:00 +0200\r\n"
         b"Message-ID: <hostile@mailgen.example>\r\n"
         b"MIME-Version: 1.0\r\n")


def _msg(subject: bytes, headers: bytes, body: bytes, head: bytes = _HEAD) -> bytes:
    return head + b"Subject: " + subject + b"\r\n" + headers + b"\r\n" + body


def _nested(depth: int) -> bytes:
    """Multiparts nested ``depth`` deep, a text part at the bottom."""
    opening = []
    for level in range(depth):
        opening.append(b"Content-Type: multipart/mixed; boundary=\"b%d\"\r\n\r\n--b%d\r\n"
                       % (level, level))
    closing = [b"\r\n--b%d--\r\n" % level for level in reversed(range(depth))]
    return (_HEAD + b"Subject: nested %d deep\r\n" % depth + b"".join(opening)
            + b"Content-Type: text/plain\r\n\r\nbottom of the nest"
            + b"".join(closing))


def many_parts(count: int) -> bytes:
    """A multipart/mixed with ``count`` small named text/plain parts."""
    part = (b"--many\r\nContent-Type: text/plain; charset=us-ascii; name=\"part%d.txt\"\r\n"
            b"\r\nsmall part number %d\r\n")
    return _msg(b"%d parts" % count, b"Content-Type: multipart/mixed; boundary=many\r\n",
                b"".join(part % (i, i) for i in range(count)) + b"--many--\r\n")


def _huge_text_attachment() -> bytes:
    line = b"Dies ist eine sehr lange Textdatei; each line is the same. 0123456789\r\n"
    content = (line * (HUGE_SIZE // len(line) + 1))[:HUGE_SIZE]
    return _msg(b"50 MB text attachment", b"Content-Type: multipart/mixed; boundary=huge\r\n",
                b"--huge\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nsee the log file\r\n"
                b"--huge\r\nContent-Type: text/plain; charset=utf-8; name=big.log\r\n"
                b"Content-Disposition: attachment; filename=big.log\r\n\r\n"
                + content + b"\r\n--huge--\r\n")


def _huge_binary_attachment() -> bytes:
    # 57 pseudo-random bytes encode to one 76-character line; repeating a
    # few distinct lines keeps generation instant.
    rng = random.Random(50)
    lines = [base64.b64encode(rng.randbytes(57)) + b"\r\n" for _ in range(64)]
    block = b"".join(lines)
    content = (block * (HUGE_SIZE // len(block) + 1))[:HUGE_SIZE // 78 * 78]
    return _msg(b"50 MB binary attachment", b"Content-Type: multipart/mixed; boundary=bin\r\n",
                b"--bin\r\nContent-Type: text/plain\r\n\r\nthe video\r\n"
                b"--bin\r\nContent-Type: video/mp4; name=\"holiday.mp4\"\r\n"
                b"Content-Transfer-Encoding: base64\r\n"
                b"Content-Disposition: attachment; filename=\"holiday.mp4\"\r\n\r\n"
                + content + b"--bin--\r\n")


@functools.lru_cache(maxsize=1)
def _hostile() -> tuple[tuple[str, bytes], ...]:
    rng = random.Random(1234)
    plain = b"Content-Type: text/plain; charset=utf-8\r\n"
    corpus: list[tuple[str, bytes]] = [
        ("empty", b""),
        ("whitespace-only", b"\r\n \r\n\t\r\n"),
        ("headers-only", b"From: anna@example.org\r\nSubject: only headers\r\n"),
        ("headers-only-blank-line",
         b"From: anna@example.org\r\nSubject: only headers\r\n\r\n"),
        ("body-only-no-headers",
         b"Hello Bob,\r\n\r\nthe invoice is attached. Regards, Anna\r\n"),
        ("random-binary", b"\x00\x89PNG" + rng.randbytes(64 * 1024)),
        ("mbox-from-line",
         b"From anna@example.org Tue Jun 13 10:00:00 2023\r\n"
         + _msg(b"mbox", plain, b"body after an mbox line\r\n")),
        ("lf-only-line-endings",
         _msg(b"lf only", plain, b"line one\r\nline two\r\n").replace(b"\r\n", b"\n")),
        ("cr-only-line-endings",
         _msg(b"cr only", plain, b"line one\r\nline two\r\n").replace(b"\r\n", b"\r")),
        ("no-blank-line-before-body",
         _HEAD + b"Subject: no separator\r\nthis line starts the body\r\nmore body\r\n"),
        # --- malformed MIME
        ("missing-boundary",
         _msg(b"missing boundary", b"Content-Type: multipart/mixed\r\n",
              b"--x\r\nContent-Type: text/plain\r\n\r\ntext in a multipart without "
              b"boundary\r\n--x--\r\n")),
        ("wrong-boundary",
         _msg(b"wrong boundary", b"Content-Type: multipart/mixed; boundary=\"abc\"\r\n",
              b"--xyz\r\nContent-Type: text/plain\r\n\r\ntext behind the wrong boundary\r\n"
              b"--xyz--\r\n")),
        ("unterminated-multipart",
         _msg(b"unterminated", b"Content-Type: multipart/mixed; boundary=\"u\"\r\n",
              b"--u\r\nContent-Type: text/plain\r\n\r\nfirst part\r\n--u\r\n"
              b"Content-Type: text/plain\r\n\r\nsecond part, never closed\r\n")),
        ("empty-multipart",
         _msg(b"empty multipart", b"Content-Type: multipart/mixed; boundary=e\r\n",
              b"--e--\r\n")),
        ("boundary-prefix-of-inner",
         _msg(b"boundary prefixes", b"Content-Type: multipart/mixed; boundary=\"b\"\r\n",
              b"--b\r\nContent-Type: multipart/alternative; boundary=\"b--x\"\r\n\r\n"
              b"--b--x\r\nContent-Type: text/plain\r\n\r\ninner plain\r\n--b--x--\r\n"
              b"--b\r\nContent-Type: text/plain; name=a.txt\r\n\r\nattached\r\n--b--\r\n")),
        ("garbage-content-type-params",
         _msg(b"garbage params",
              b"Content-Type: text/plain; ;; charset===\"utf-8; name*0*=%%%ZZ; "
              b"name*9999999999=x; =; \"\\; boundary\r\n",
              b"body with garbage parameters\r\n")),
        ("content-type-without-subtype",
         _msg(b"no subtype", b"Content-Type: text\r\n", b"body of a type without subtype\r\n")),
        ("content-type-garbage",
         _msg(b"garbage type", b"Content-Type: \x01\x02/\xff\xfe; charset=\r\n",
              b"body of a garbage type\r\n")),
        ("multipart-digest",
         _msg(b"digest", b"Content-Type: multipart/digest; boundary=d\r\n",
              b"--d\r\n\r\nFrom: x@example.org\r\nSubject: digest entry\r\n\r\n"
              b"digest entry text\r\n--d--\r\n")),
        ("message-rfc822-attached",
         _msg(b"forwarded", b"Content-Type: multipart/mixed; boundary=f\r\n",
              b"--f\r\n" + plain + b"\r\nsee the forwarded mail\r\n--f\r\n"
              b"Content-Type: message/rfc822; name=\"fwd.eml\"\r\n\r\n"
              b"From: carl@example.org\r\nSubject: the original\r\n"
              b"Content-Type: text/html\r\n\r\n<p>original <b>html</b> text</p>\r\n--f--\r\n")),
        ("message-rfc822-base64",
         _msg(b"forwarded base64", b"Content-Type: multipart/mixed; boundary=f\r\n",
              b"--f\r\nContent-Type: message/rfc822\r\nContent-Transfer-Encoding: base64\r\n"
              b"\r\n" + _b64(b"Subject: inner\r\n\r\ninner base64 message body\r\n")
              + b"--f--\r\n")),
        # --- charsets
        ("utf8-declared-latin1-bytes",
         _msg(b"latin-1 labelled utf-8", plain,
              "Grüße aus Köln, die Häuser sind schön.\r\n".encode("latin-1"))),
        ("unknown-charset",
         _msg(b"unknown charset", b"Content-Type: text/plain; charset=x-foo\r\n",
              "Grüße in an unknown charset\r\n".encode())),
        ("empty-charset",
         _msg(b"empty charset", b"Content-Type: text/plain; charset=\"\"\r\n",
              "Grüße with an empty charset\r\n".encode("cp1252"))),
        ("codec-abuse-charsets",
         _msg(b"codec abuse", b"Content-Type: multipart/mixed; boundary=c\r\n",
              b"--c\r\nContent-Type: text/plain; charset=zlib\r\n\r\n"
              + zlib.compress(b"hello from zlib") + b"\r\n"
              b"--c\r\nContent-Type: text/plain; charset=unicode_escape\r\n\r\n"
              b"\\N{BOGUS} \\x\xff\r\n"
              b"--c\r\nContent-Type: text/plain; charset=idna\r\n\r\n\xff.\xfe\r\n"
              b"--c\r\nContent-Type: text/plain; charset=\"utf-8\x00\"\r\n\r\nnul label\r\n"
              b"--c--\r\n")),
        ("utf7-lone-surrogate",
         _msg(b"=?utf-7?Q?+2D0-?=", b"Content-Type: text/plain; charset=utf-7\r\n",
              b"lone +2D0- surrogate\r\n")),
        ("broken-encoded-words",
         _HEAD.replace(b"From: Anna Muster", b"From: =?x-unknown?q?Anna_M=FCster?=")
         + b"Subject: =?utf-8?B?!!!?= =?utf-8?Q?unterminated =?utf-8?b?w6?= "
           b"=?utf-8?q?=E2=82?= =?utf-8?q?=AC?= =?bogus?X?x?=\r\n\r\nbody\r\n"),
        # --- NUL and 8-bit
        ("nul-in-headers",
         _msg(b"nul \x00 in subject", b"X-Nul: \x00\x00\r\n",
              b"body\r\n", head=_HEAD.replace(b"Anna Muster", b"Anna\x00Muster"))),
        ("nul-in-body",
         _msg(b"nul in body", plain, b"before\x00after\x00\x00end\r\n")),
        ("nul-in-base64-body",
         _msg(b"nul in base64 body",
              plain + b"Content-Transfer-Encoding: base64\r\n",
              _b64(b"decoded\x00nul\x00bytes"))),
        ("8bit-raw-headers-latin1",
         _msg("Grüße aus Köln".encode("latin-1"), plain, b"body\r\n",
              head=_HEAD.replace(b"Anna Muster", "Jörg Müller".encode("latin-1")))),
        ("8bit-raw-headers-utf8",
         _msg("Grüße aus Köln €".encode(), plain, b"body\r\n",
              head=_HEAD.replace(b"Anna Muster", "Jörg Müller".encode()))),
        # --- dates
        ("date-1601", _msg(b"old", plain, b"body\r\n",
                           head=_HEAD.replace(b"Tue, 13 Jun 2023 10:00:00 +0200",
                                              b"Mon, 1 Jan 1601 00:00:00 +0000"))),
        ("date-2099", _msg(b"future", plain, b"body\r\n",
                           head=_HEAD.replace(b"Tue, 13 Jun 2023 10:00:00 +0200",
                                              b"Thu, 1 Jan 2099 00:00:00 +0000"))),
        ("date-garbage", _msg(b"garbage date", plain, b"body\r\n",
                              head=_HEAD.replace(b"Tue, 13 Jun 2023 10:00:00 +0200",
                                                 b"the day after tomorrow \xff"))),
        ("date-absurd-fields", _msg(b"absurd date", plain, b"body\r\n",
                                    head=_HEAD.replace(b"Tue, 13 Jun 2023 10:00:00 +0200",
                                                       b"Mon, 99 Feb 2020 99:99:99 +9999"))),
        ("date-year-99999", _msg(b"far future", plain, b"body\r\n",
                                 head=_HEAD.replace(b"Tue, 13 Jun 2023 10:00:00 +0200",
                                                    b"1 Jan 99999 00:00:00 +0000"))),
        ("date-missing", _msg(b"no date", plain, b"body\r\n",
                              head=_HEAD.replace(b"Date: Tue, 13 Jun 2023 10:00:00 +0200\r\n",
                                                 b""))),
        # --- encodings
        ("invalid-base64",
         _msg(b"invalid base64", plain + b"Content-Transfer-Encoding: base64\r\n",
              b"SGVsbG8g!!!d29y*bGQ\r\n====\r\nnot base64 at all: @@@ \xff\r\n")),
        ("invalid-quoted-printable",
         _msg(b"invalid qp", plain + b"Content-Transfer-Encoding: quoted-printable\r\n",
              b"caf=C3=A9 =ZZ =\r\n=4 =\xff end=")),
        ("unknown-transfer-encoding",
         _msg(b"x-uuencode", plain + b"Content-Transfer-Encoding: x-uuencode\r\n",
              b"begin 644 a.txt\r\n#86)C\r\n`\r\nend\r\n")),
        ("html-only-malformed",
         _msg(b"bad html", b"Content-Type: text/html\r\n",
              b"<html><head><title>t</title><style>x{}</style><body><p>visible &amp; "
              b"&uuml;ber &#0; &#xD800; &bogus; <a href=x>link text</a><script>var x = "
              b"'<p>hidden'</script><![if foo]><!-- unclosed comment <p>tail")),
        # --- size
        ("header-line-1mb",
         _msg(b"A" * (1024 * 1024), plain, b"body after a 1 MB subject\r\n")),
        ("header-folded-100k-lines",
         _msg(b"folded" + b"\r\n folded" * 100_000, plain, b"body after a folded subject\r\n")),
        ("header-fields-100k",
         _msg(b"many fields", b"X-Filler: yes\r\n" * 100_000 + plain, b"body\r\n")),
        ("huge-text-attachment-50mb", _huge_text_attachment()),
        ("huge-binary-attachment-50mb-base64", _huge_binary_attachment()),
        ("huge-qp-body-5mb",
         _msg(b"5 MB body", plain + b"Content-Transfer-Encoding: quoted-printable\r\n",
              _qp(("Häuser und Rechnungen " * 240_000).encode()))),
        ("boundary-lookalike-lines",  # lines that start like the boundary, 2 MB
         _msg(b"lookalikes", b"Content-Type: multipart/mixed; boundary=a\r\n",
              b"--a\r\nContent-Type: text/plain\r\n\r\n" + b"--ab\r\n" * 350_000
              + b"--a--\r\n")),
        ("leading-continuation-lines", b" folded\r\n" * 100_000 + b"Subject: x\r\n\r\nbody"),
        ("empty-parts-100000",
         _msg(b"empty parts", b"Content-Type: multipart/mixed; boundary=e\r\n",
              b"--e\r\n\r\n" * 100_000 + b"--e--\r\n")),
        ("message-rfc822-nested-1000-deep",
         _HEAD + b"Subject: russian doll\r\n"
         + b"Content-Type: message/rfc822\r\n\r\nSubject: inner\r\n" * 1000
         + b"\r\ninnermost text\r\n"),
        (f"nested-{NESTED_DEEP}-deep", _nested(NESTED_DEEP)),
        (f"nested-{NESTED_VERY_DEEP}-deep", _nested(NESTED_VERY_DEEP)),
        (f"parts-{MANY_PARTS}", many_parts(MANY_PARTS)),
    ]
    return tuple(corpus)


def hostile_messages() -> list[tuple[str, bytes]]:
    """The hostile corpus: (name, raw) pairs; names are unique."""
    return list(_hostile())


def hostile_message(name: str) -> bytes:
    for entry_name, raw in _hostile():
        if entry_name == name:
            return raw
    raise KeyError(name)
