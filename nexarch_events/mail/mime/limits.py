"""The caps that bound what one message may cost (see the package docstring).

Every stage reads its caps from here, so a cap is changed in one place."""

from __future__ import annotations

#: Characters kept per text field (``body``, ``attachment_text``) by default.
DEFAULT_MAX_TEXT_CHARS = 1_000_000
#: Bytes of one header field's value that are read; the rest is dropped.
MAX_HEADER_CHARS = 65_536
#: Header fields read per header section (only the fields used count:
#: Subject, From, To, Cc, Date, Message-ID, Content-*); the rest are skipped.
MAX_HEADER_FIELDS = 10_000
#: Leaf parts looked at (and, separately, multipart containers split).
MAX_PARTS = 10_000
#: Nesting levels of multiparts and attached messages that are descended.
MAX_DEPTH = 128
MAX_ATTACHMENT_NAMES = 1_000
MAX_NAME_CHARS = 1_000
MAX_NOTES = 100
#: Bytes of HTML read per character of the remaining text budget.
HTML_INPUT_FACTOR = 8

#: Upper bound of bytes per character in any charset we decode (UTF-8,
#: UTF-32, GB 18030): slicing a part to 4 x budget bytes never loses text
#: that the cap would keep.
BYTES_PER_CHAR = 4
