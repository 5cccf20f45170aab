"""The default log format (key=value lines): a message is one line, whatever
text it quotes (found by a security audit: an IMAP server's NO text with a
bare LF printed a line that read like a record of its own)."""

from __future__ import annotations

import io
import logging

from nexarch_events.cli.app import KvFormatter


def formatted(message: str, *args: object, exc: BaseException | None = None) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(KvFormatter())
    log = logging.getLogger("test.kv")
    log.handlers[:], log.propagate = [handler], False
    try:
        if exc is None:
            log.warning(message, *args)
        else:
            try:
                raise exc
            except type(exc):
                log.exception(message, *args)
    finally:
        log.handlers[:] = []
    return stream.getvalue()


def test_a_quoted_text_with_line_breaks_stays_on_its_line() -> None:
    out = formatted("mailbox %s: %s", "acme/inbox",
                    "NO later\n2026-12-03 00:00:00,000 level=CRITICAL FORGED\r\x1b[2J")
    assert out.count("\n") == 1 and out.endswith("\n")
    assert "level=WARNING logger=test.kv mailbox acme/inbox: NO later\\x0a2026-12-03" in out
    assert "\\x0d\\x1b[2J" in out


def test_a_traceback_keeps_its_lines() -> None:
    out = formatted("failed: %s", "a\nb", exc=ValueError("boom"))
    first, *rest = out.splitlines()
    assert first.endswith("failed: a\\x0ab")
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "ValueError: boom"


def test_a_lone_surrogate_is_written_as_an_escape_not_lost() -> None:
    # Text decoded with surrogateescape (a file name, a header) cannot be
    # encoded on a UTF-8 stream: the record was dropped with "--- Logging
    # error ---" on stderr.
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", write_through=True)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(KvFormatter())
    handler.handleError = lambda record: (_ for _ in ()).throw(AssertionError("lost"))  # type: ignore[method-assign]
    log = logging.getLogger("test.kv.surrogate")
    log.handlers[:], log.propagate = [handler], False
    try:
        log.warning("folder %s\tnamed", b"caf\xff".decode("utf-8", "surrogateescape"))
    finally:
        log.handlers[:] = []
    assert raw.getvalue().decode().endswith("folder caf\\udcff\tnamed\n")
