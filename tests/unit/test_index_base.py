from __future__ import annotations

import pytest

from nexarch_events.index.base import HIGHLIGHT_END, HIGHLIGHT_START, render_snippet
from nexarch_events.index.manticore import ManticoreBackend
from nexarch_events.mail.indexer import Indexer


def test_render_snippet_escapes_mail_text_and_marks_matches() -> None:
    raw = f"<script>x</script> & {HIGHLIGHT_START}invoice{HIGHLIGHT_END} \x00<mark>"
    assert render_snippet(raw) == (
        "&lt;script&gt;x&lt;/script&gt; &amp; <mark>invoice</mark> &lt;mark&gt;")


def test_an_index_backend_must_say_whether_it_fences_in_the_database() -> None:
    """Without ``fences_in_database`` the Indexer would have to guess whether
    erased mail needs re-checking after each write: it refuses at once."""
    class Undeclared:
        name = "custom"

    with pytest.raises(TypeError, match="Undeclared must declare fences_in_database"):
        Indexer(None, Undeclared())  # type: ignore[arg-type]
    assert ManticoreBackend.fences_in_database is False
