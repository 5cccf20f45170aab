from __future__ import annotations

from nexarch_events.index.base import HIGHLIGHT_END, HIGHLIGHT_START, render_snippet


def test_render_snippet_escapes_mail_text_and_marks_matches() -> None:
    raw = f"<script>x</script> & {HIGHLIGHT_START}invoice{HIGHLIGHT_END} \x00<mark>"
    assert render_snippet(raw) == (
        "&lt;script&gt;x&lt;/script&gt; &amp; <mark>invoice</mark> &lt;mark&gt;")
