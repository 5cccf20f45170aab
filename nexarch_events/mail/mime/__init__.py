"""MIME to index document: turn the raw bytes of one message into the fields
the search index stores (``parse_message``, then ``to_index_document``).

Extracted: Subject, From, To and Cc (display names and addresses), Date,
Message-ID, the text body (the text/plain parts; the text/html parts reduced
to text when there is no plain text), attachment file names, and the text of
text/* attachments and of attached messages. Headers are RFC 2047 decoded,
parameters RFC 2231 decoded, and any charset Python knows is honoured.

Nothing in a message makes ``parse_message`` raise anything but ``MimeError``,
and that only when there is no message at all (empty input, or binary data
with no header fields). Everything else is repaired and yields a document;
each repair, and each cap below when it bites, adds a human-readable line to
``ParsedMessage.notes``. Every string returned is NUL-free text that encodes
to UTF-8 (what Postgres ``text`` and ``jsonb`` accept).

Caps (so a hostile message costs bounded time and memory):

- ``max_text_chars`` (default ``DEFAULT_MAX_TEXT_CHARS`` = 1,000,000)
  characters for ``body`` and, separately, for ``attachment_text``. A
  gigantic part is sliced *before* it is decoded: at most about
  4 bytes per character of its transfer-decoded content are read.
- ``HTML_INPUT_FACTOR`` (8) bytes of HTML per character of budget are read
  when HTML is reduced to text (linear-time regular expressions, not
  html.parser, which is quadratic on hostile markup in Python 3.11).
- ``MAX_HEADER_CHARS`` (65,536) bytes of each header field value, and
  ``MAX_HEADER_FIELDS`` (10,000) fields per header section.
- ``MAX_PARTS`` (10,000) leaf parts and as many multipart containers.
- ``MAX_DEPTH`` (128) levels of nested multiparts and attached messages.
- ``MAX_ATTACHMENT_NAMES`` (1,000) names of ``MAX_NAME_CHARS`` (1,000) each.
- ``MAX_NOTES`` (100) notes; the last one says how many more there were.

Text is returned as decoded: line breaks stay as the message has them
(usually CRLF; normalising costs more than the rest of the decoding and no
index cares), except that HTML reduced to text has one line per block.

Performance (bench/mime_bench.py): the message is never copied whole and
never walked line by line in Python. Header sections and boundaries are
found by C-level searches (``re``, ``bytes.find``) on the raw buffer, parts
are addressed by offsets into it, fields nobody uses are never copied,
binary attachments are never decoded, and HTML is only reduced to text when
no plain text exists. Everything is linear in the input size.

Thread-safe: no shared mutable state (the indexer parses in worker threads).

Where each stage lives (tests: tests/unit/test_mime_<module>.py):

- ``message.py``   parse_message: the stages in order, the result assembled
- ``headers.py``   header sections, field text, RFC 2047 encoded words,
                   RFC 2231 parameters, Subject, Message-ID, a part's Content-*
- ``addresses.py`` From/To/Cc;  ``dates.py``: Date (all of it in header_date)
- ``parts.py``     the MIME tree: multipart boundaries, attached messages,
                   text budgets
- ``transfer.py``  base64 / quoted-printable, sliced before decoding
- ``charsets.py``  charset labels to codecs, fallbacks
- ``html.py``      HTML to text
- ``notes.py``     the notes collector and string cleaning;  ``limits.py``: caps
"""

from __future__ import annotations

from .addresses import Address
from .html import html_to_text
from .limits import (
    DEFAULT_MAX_TEXT_CHARS,
    HTML_INPUT_FACTOR,
    MAX_ATTACHMENT_NAMES,
    MAX_DEPTH,
    MAX_HEADER_CHARS,
    MAX_HEADER_FIELDS,
    MAX_NAME_CHARS,
    MAX_NOTES,
    MAX_PARTS,
)
from .message import MimeError, ParsedMessage, parse_message, to_index_document

__all__ = [
    "DEFAULT_MAX_TEXT_CHARS",
    "HTML_INPUT_FACTOR",
    "MAX_ATTACHMENT_NAMES",
    "MAX_DEPTH",
    "MAX_HEADER_CHARS",
    "MAX_HEADER_FIELDS",
    "MAX_NAME_CHARS",
    "MAX_NOTES",
    "MAX_PARTS",
    "Address",
    "MimeError",
    "ParsedMessage",
    "html_to_text",
    "parse_message",
    "to_index_document",
]
