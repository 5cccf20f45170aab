"""HTML to text: the visible text of an HTML part, for the index.

Not html.parser: on Python 3.11 it is quadratic on unclosed tags ("<a " x
10,000 -- 30 KB -- takes 25 s; fixed upstream only in 2025). These three
regular expressions are linear on any input: every branch, once its first
characters match, cannot fail (unterminated constructs run to the end),
and alternatives start with different characters, so nothing backtracks."""

from __future__ import annotations

import re
from html import unescape

from .limits import DEFAULT_MAX_TEXT_CHARS

__all__ = ["html_to_text"]

#: Elements whose content is not text: dropped with their content. <head>
#: holds no visible text but its <title>, so dropping these drops the head.
_HTML_HIDDEN = re.compile(
    r"<!--.*?(?:-->|\Z)|<(script|style|title|template)\b.*?(?:</\1\s*>|\Z)",
    re.S | re.I)
_HTML_TAG = re.compile(
    r"""<(/?)([a-zA-Z][a-zA-Z0-9:-]*)(?:[^>"']+|"[^"]*"?|'[^']*'?)*>?|<[!?][^>]*>?""")
_HTML_BREAK = frozenset({
    "br", "p", "div", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "table", "blockquote",
    "hr", "pre", "ul", "ol", "dl", "dd", "dt", "section", "article", "header", "footer",
    "address", "center", "form", "fieldset", "figure", "figcaption", "main", "nav", "aside",
    "body", "html", "head", "caption", "tbody", "thead", "tfoot"})
_HTML_SPACE = frozenset({"td", "th", "img", "input", "button", "select", "option", "label"})


#: What a tag becomes: a line break, a space, or (inline tags) nothing.
_HTML_TAG_TEXT = {name: "\x1e" for name in _HTML_BREAK} | {name: " " for name in _HTML_SPACE}


def _html_tag(m: re.Match[str]) -> str:
    name = m.group(2)  # None for <!DOCTYPE>, <![if ...]>, <?xml ...?>
    return "" if name is None else _HTML_TAG_TEXT.get(name.lower(), "")


def html_to_text(html: str, max_chars: int = DEFAULT_MAX_TEXT_CHARS) -> tuple[str, bool]:
    """Visible text of an HTML document: script, style, title (the head)
    and comments dropped, link text kept, entities decoded, whitespace
    collapsed, one line per block element. Linear time on any input.
    Returns (text, cut): cut is True if the text was capped at max_chars."""
    text = _HTML_HIDDEN.sub(" ", html) if "<" in html else html
    text = _HTML_TAG.sub(_html_tag, text)
    if "&" in text:
        text = unescape(text)
    text = "\n".join(filter(None, [" ".join(chunk.split()) for chunk in text.split("\x1e")]))
    if len(text) > max_chars:
        return text[:max_chars], True
    return text, False
