"""Body and part walking: the MIME tree under a message's header section,
walked without recursion (a stack of regions of the raw buffer, by
offsets), multiparts split at their boundary lines, attached messages
(message/rfc822) descended, and the text of text/* parts decoded into the
body or the attachment text within their character budgets.

Header-level decisions (which type, charset, file name a part has) are
made in headers.py; this module decides what to do with each part."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from .addresses import addresses
from .charsets import decode_text
from .headers import (
    ATTACHED_FIELDS,
    PART_FIELDS,
    Fields,
    note_header_caps,
    part_header,
    read_headers,
    subject,
)
from .html import html_to_text
from .limits import (
    BYTES_PER_CHAR,
    HTML_INPUT_FACTOR,
    MAX_ATTACHMENT_NAMES,
    MAX_DEPTH,
    MAX_NAME_CHARS,
    MAX_PARTS,
)
from .notes import Notes, quote, without_nul
from .transfer import transfer_decode

__all__ = ["Contents", "find_delimiter", "multipart_regions", "walk"]

_DELIM_TAIL = re.compile(rb"[ \t]*(?:\r\n|\n|\r|$)")
#: A line that looks like a boundary line ("--" and a token, maybe "--").
_GUESS_BOUNDARY = re.compile(rb"^--([!-~][ -~]{0,199}?)(?:--)?[ \t]*\r?$", re.M)
_META_CHARSET = re.compile(rb"""<meta[^>]{0,512}?charset\s*=\s*["']?\s*([A-Za-z0-9._:-]{1,40})""",
                           re.I)


class Contents(NamedTuple):
    """What the walk found below the top-level header section. (A named
    tuple: cheaper to build than a frozen dataclass, and as immutable.)"""

    #: The text/plain parts joined; else the HTML parts reduced to text.
    body: str
    attachment_names: tuple[str, ...]
    #: Text of text/* attachments and attached messages (not the body).
    attachment_text: str


def walk(raw: bytes, body_start: int, fields: Fields, max_chars: int, notes: Notes
         ) -> Contents:
    """The contents of the message ``raw`` whose top-level header section,
    already read, holds ``fields`` and ends at ``body_start``. Each text
    field is capped at ``max_chars`` characters; what was capped or
    repaired is noted in ``notes``."""
    return _Walker(len(raw), max_chars, notes).walk(raw, body_start, fields)


# --------------------------------------------------------------------------
# Boundaries


def find_delimiter(buf: bytes, delim: bytes, pos: int, start: int, end: int
                   ) -> tuple[int, int, bool] | None:
    """Next boundary line at or after pos: (line start, offset after the
    line, is it the closing one). Lenient like the stdlib: whitespace may
    follow the boundary; anything else means it is not a boundary line."""
    if pos == start and buf.startswith(delim, start, end):
        found = _delimiter_line(buf, start, len(delim), end)
        if found is not None:
            return found
    line_delim = b"\n" + delim
    find = buf.find
    for _ in range(64):
        i = find(line_delim, pos, end)
        if i < 0:
            return None
        found = _delimiter_line(buf, i + 1, len(delim), end)
        if found is not None:
            return found
        pos = i + 1
    # Many lines start like a boundary but are none ("--ab" for "a"): let the
    # regular expression engine skip them in C rather than loop here.
    m = _delimiter_pattern(delim).search(buf, pos, end)
    return None if m is None else (m.start() + 1, m.end(), m.group(1) is not None)


def _delimiter_line(buf: bytes, i: int, n: int, end: int) -> tuple[int, int, bool] | None:
    """(i, offset after the line, closing?) if buf[i:] is a boundary line
    whose boundary ("--" included) is n bytes long."""
    j = i + n
    if buf.startswith(b"--", j, end):
        m = _DELIM_TAIL.match(buf, j + 2, end)
        if m is not None:
            return i, m.end(), True
    m = _DELIM_TAIL.match(buf, j, end)
    return None if m is None else (i, m.end(), False)


@functools.lru_cache(maxsize=32)
def _delimiter_pattern(delim: bytes) -> re.Pattern[bytes]:
    return re.compile(rb"\n" + re.escape(delim) + rb"(--)?[ \t]*(?:\r\n|\n|\r|\Z)")


def multipart_regions(buf: bytes, delim: bytes, first: tuple[int, int, bool], start: int,
                      end: int, room: int) -> tuple[list[tuple[int, int]], bool]:
    """The body parts of the multipart in buf[start:end] whose first
    boundary line ``find_delimiter`` found (``first``): their (start, end)
    offsets, line break before each boundary excluded, at most ``room`` + 1
    of them. Returns (regions, whether the closing boundary is missing)."""
    regions: list[tuple[int, int]] = []
    _line, pos, closed = first
    while not closed and len(regions) <= room:
        found = find_delimiter(buf, delim, pos, start, end)
        if found is None:
            regions.append((pos, end))
            return regions, True
        line, after, closed = found
        stop = line  # the line break before a boundary belongs to it
        if stop > pos and buf[stop - 1] == 10:
            stop -= 1
        if stop > pos and buf[stop - 1] == 13:
            stop -= 1
        regions.append((pos, stop))
        pos = after
    return regions, False


# --------------------------------------------------------------------------
# The walk


@dataclass(frozen=True, slots=True)
class _Job:
    """A part still to be visited: a region of a buffer, by offsets."""

    buf: bytes
    start: int
    end: int
    #: Pre-read header fields (the top level), or None to read them here.
    fields: Fields | None
    path: str
    depth: int
    ctx: _Context
    default_type: str
    #: The region is a whole message (the top level or message/rfc822).
    message_root: bool


@dataclass(slots=True)
class _Budget:
    """Characters left for one text field; notes the cap once."""

    label: str
    left: int
    cut: bool = False


@dataclass(slots=True)
class _Context:
    """One message: the top level (its text is the body) or an attached
    message (its text goes to attachment_text)."""

    top: bool
    plain: list[str] = field(default_factory=list)
    #: text/html parts (job, transfer encoding, charset, where), reduced to
    #: text only if no plain text turns up.
    html: list[tuple[_Job, str, str, str]] = field(default_factory=list)
    headers_text: str = ""
    #: Index in the attachment text pieces (attached messages only).
    slot: int = -1


def _attached_headers_text(fields: Fields, notes: Notes) -> str:
    """An attached message's Subject and From, searchable with its text."""
    lines = []
    text = subject(fields, notes)
    if text:
        lines.append(f"Subject: {text}")
    sender = ", ".join(a.display() for a in addresses(fields, b"from", notes))
    if sender:
        lines.append(f"From: {sender}")
    return "\n".join(lines)


class _Walker:
    """The state of one walk: budgets, counters, names, notes."""

    def __init__(self, raw_size: int, max_chars: int, notes: Notes) -> None:
        self.max_chars = max_chars
        self.notes = notes
        self.note = notes.add
        self.body = _Budget("body", max_chars)
        self.attachment = _Budget("attachment text", max_chars)
        self.attachment_pieces: list[str] = []
        self.names: list[str] = []
        self.names_dropped = 0
        self.leaves = 0
        self.containers = 0
        self.stopped = False
        self.depth_noted = False
        #: Bytes we may materialise decoding encoded message/rfc822 parts.
        self.decode_budget = raw_size + (1 << 20)

    def walk(self, raw: bytes, body_start: int, fields: Fields) -> Contents:
        top = _Context(top=True)
        contexts = [top]
        stack = [_Job(raw, body_start, len(raw), fields, "", 0, top, "text/plain", True)]
        while stack and not self.stopped:
            self.visit(stack.pop(), stack, contexts)

        body = self.context_text(top, self.body)
        for ctx in contexts[1:]:
            self.attachment_pieces[ctx.slot] = self.context_text(ctx, self.attachment)
        attachment_text = "\n".join(p for p in self.attachment_pieces if p)
        if self.names_dropped:
            self.note(f"only the first {MAX_ATTACHMENT_NAMES} attachment names kept "
                      f"({MAX_ATTACHMENT_NAMES + self.names_dropped} in total)")
        return Contents(body=without_nul(body[:self.max_chars]),
                        attachment_names=tuple(self.names),
                        attachment_text=without_nul(attachment_text[:self.max_chars]))

    # ---- text

    def take_text(self, budget: _Budget, job: _Job, start: int, cte: str, charset: str,
                  html: bool, where: str) -> str:
        """Text of one leaf part, charged to ``budget``; notes when capped."""
        if budget.left <= 0:
            if not budget.cut:
                budget.cut = True
                self.note(f"{budget.label} truncated to {self.max_chars} characters; "
                          f"{where} and later parts skipped")
            return ""
        factor = HTML_INPUT_FACTOR if html else BYTES_PER_CHAR
        data, cut = transfer_decode(job.buf, start, job.end, cte, factor * budget.left + 16,
                                    where, self.notes)
        if html and not charset:
            m = _META_CHARSET.search(data, 0, 4096)
            if m is not None:
                charset = m.group(1).decode("ascii")
        # Line breaks stay as they are (CRLF mostly): normalising them would
        # cost more than the rest of the decoding, and no index cares.
        text = decode_text(data, charset, where, self.notes, final=not cut)
        if html:
            text, html_cut = html_to_text(text, budget.left)
            cut = cut or html_cut
        if "\x00" in text:
            self.note(f"removed {text.count(chr(0))} NUL characters from {where}")
            text = text.replace("\x00", "")
        if len(text) > budget.left:
            text = text[:budget.left]
            cut = True
        if cut:
            budget.cut = True
            self.note(f"{budget.label} truncated to {self.max_chars} characters ({where} "
                      f"is {job.end - start} bytes{' of HTML' if html else ''})")
        budget.left -= len(text) + 1
        return text  # decode_text removed any surrogates, the NULs are gone

    def context_text(self, ctx: _Context, budget: _Budget) -> str:
        """A message's text: its plain parts, else its HTML parts as text."""
        texts = [ctx.headers_text] if ctx.headers_text else []
        if any(not t.isspace() for t in ctx.plain):  # (texts are never empty)
            texts += ctx.plain
        elif ctx.html:
            for job, cte, charset, where in ctx.html:
                text = self.take_text(budget, job, job.start, cte, charset, True, where)
                if text:
                    texts.append(text)
        return "\n".join(texts)

    # ---- the MIME tree

    def visit(self, job: _Job, stack: list[_Job], contexts: list[_Context]) -> None:
        fields = job.fields
        start = job.start
        path = job.path
        if job.message_root:
            where = f"part {path}.1" if path else "part 1"
            container = f"the message in part {path}" if path else "the message"
        else:
            where = container = f"part {path}"
        if fields is None:
            wanted = ATTACHED_FIELDS if job.message_root else PART_FIELDS
            fields, start, _has_fields, too_many, truncated = read_headers(
                job.buf, job.start, job.end, wanted)
            note_header_caps(self.notes, too_many, truncated, f" in {container}")
            if job.message_root:
                job.ctx.headers_text = _attached_headers_text(fields, self.notes)
        ctype, params, disposition, cte, filename = part_header(fields, job.default_type,
                                                                where, self.notes)
        maintype, _, subtype = ctype.partition("/")

        if maintype == "multipart":
            if self.split_multipart(job, start, params.get("boundary", ""), ctype,
                                    container, stack):
                return
            maintype, subtype = "text", "plain"
        elif ctype in ("message/rfc822", "message/global"):
            if filename:
                self.add_name(filename)
            self.attached_message(job, start, cte, where, stack, contexts)
            return

        self.leaves += 1
        if self.leaves > MAX_PARTS:
            self.note(f"message has more than {MAX_PARTS} parts; the rest were skipped")
            self.stopped = True
            return
        if filename:
            self.add_name(filename)
        if maintype != "text":
            return  # binary content is never decoded
        charset = params.get("charset", "")
        attachment = disposition == "attachment" or bool(filename)
        ctx = job.ctx
        if not attachment and subtype == "html":
            ctx.html.append((_Job(job.buf, start, job.end, None, path, job.depth, ctx,
                                  ctype, False), cte, charset, where))
        elif not attachment and subtype == "plain":
            text = self.take_text(self.body if ctx.top else self.attachment, job, start, cte,
                                  charset, False, where)
            if text:
                ctx.plain.append(text)
        else:
            text = self.take_text(self.attachment, job, start, cte, charset,
                                  subtype == "html", where)
            if text:
                self.attachment_pieces.append(text)

    def too_deep(self, job: _Job) -> bool:
        if job.depth < MAX_DEPTH:
            return False
        if not self.depth_noted:
            self.depth_noted = True
            self.note(f"MIME structure nested deeper than {MAX_DEPTH} levels; "
                      f"the inner parts were skipped")
        return True

    def split_multipart(self, job: _Job, start: int, boundary: str, ctype: str, where: str,
                        stack: list[_Job]) -> bool:
        """Push the parts of a multipart; False if it has to be read as text."""
        if self.too_deep(job):
            return True
        buf, end = job.buf, job.end
        found = None
        if boundary:
            delim = b"--" + boundary.encode("utf-8", "replace")
            found = find_delimiter(buf, delim, start, start, end)
        if found is None:
            # Missing or wrong: mailers that get it wrong still write the
            # boundary lines they meant, so use the first one in the body.
            problem = (f"boundary {quote(boundary)} of {where} never occurs" if boundary
                       else f"{ctype} without boundary in {where}")
            m = _GUESS_BOUNDARY.search(buf, start, min(end, start + 65_536))
            guess = m.group(1) if m is not None else b""
            if guess:
                delim = b"--" + guess
                found = find_delimiter(buf, delim, start, start, end)
            if found is None:
                self.note(f"{problem}; read as plain text")
                return False
            self.note(f"{problem}; used {quote(guess.decode('latin-1'))} found in the body")
        self.containers += 1
        if self.containers > MAX_PARTS:
            self.note(f"message has more than {MAX_PARTS} multipart containers; "
                      f"the rest were skipped")
            self.stopped = True
            return True
        regions, unclosed = multipart_regions(buf, delim, found, start, end,
                                              MAX_PARTS - self.leaves + 1)
        if unclosed:
            self.note(f"{ctype} in {where} has no closing boundary; read to the end")
        default = "message/rfc822" if ctype == "multipart/digest" else "text/plain"
        prefix = job.path + "." if job.path else ""
        for number in range(len(regions), 0, -1):
            s, e = regions[number - 1]
            stack.append(_Job(buf, s, e, None, f"{prefix}{number}", job.depth + 1, job.ctx,
                              default, False))
        return True

    def attached_message(self, job: _Job, start: int, cte: str, where: str,
                         stack: list[_Job], contexts: list[_Context]) -> None:
        if self.too_deep(job):
            return
        buf, end = job.buf, job.end
        if cte in ("base64", "quoted-printable"):
            if end - start > self.decode_budget:
                self.note(f"attached message in {where} skipped: decoding it would "
                          f"exceed the memory limit")
                return
            data, _cut = transfer_decode(buf, start, end, cte, end - start, where, self.notes)
            self.decode_budget -= len(data)
            buf, start, end = data, 0, len(data)
        ctx = _Context(top=False, slot=len(self.attachment_pieces))
        self.attachment_pieces.append("")
        contexts.append(ctx)
        stack.append(_Job(buf, start, end, None, job.path or "1", job.depth + 1, ctx,
                          "text/plain", True))

    def add_name(self, name: str) -> None:
        if len(self.names) >= MAX_ATTACHMENT_NAMES:
            self.names_dropped += 1
        elif name:
            self.names.append(name[:MAX_NAME_CHARS])
