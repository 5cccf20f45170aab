"""mail/mime/html.py: HTML reduced to its visible text."""

from __future__ import annotations

import pytest

from nexarch_events.mail.mime.html import html_to_text


@pytest.mark.parametrize(("html", "expected"), [
    ("<head><title>Newsletter</title><style>p {color: red}</style></head><p>hi</p>", "hi"),
    ("<script>alert('<p>x</p>')</script>after", "after"),
    ("<SCRIPT type='x'>a</script >b", "b"),
    ("<template><p>later</p></template>now", "now"),
    ("a<!-- hidden <p>text</p> -->b", "a b"),
    ("<style>never closed <p>x", ""),            # unterminated: runs to the end
    ("before<!-- never closed", "before"),
    ("<scripty>kept</scripty>", "kept"),         # only the element itself is hidden
])
def test_hidden_elements_are_dropped_with_their_content(html: str, expected: str) -> None:
    assert html_to_text(html) == (expected, False)


@pytest.mark.parametrize(("html", "expected"), [
    ("caf&eacute; &amp; cr&egrave;me", "café & crème"),
    ("&#x41;&#66;&nbsp;C", "AB C"),                # (a no-break space is whitespace)
    ("&lt;p&gt; is not a tag", "<p> is not a tag"),
    ("AT&T &bogus; &", "AT&T &bogus; &"),
    ("&amp;lt;", "&lt;"),                        # decoded once, not twice
])
def test_entities_are_decoded(html: str, expected: str) -> None:
    assert html_to_text(html) == (expected, False)


def test_entities_decode_after_tags_are_removed() -> None:
    # An escaped tag becomes text, it does not become markup.
    assert html_to_text("&lt;script&gt;x&lt;/script&gt;") == ("<script>x</script>", False)


def test_block_elements_make_lines_and_cells_make_spaces() -> None:
    html = ("<h1>Title</h1><table><tr><td>a</td><td>b</td></tr><tr><th>c</th></tr></table>"
            "<ul><li>one<li>two</ul>in<b>line</b><span>text</span>")
    assert html_to_text(html) == ("Title\na b\nc\none\ntwo\ninlinetext", False)


def test_whitespace_is_collapsed_and_blank_lines_dropped() -> None:
    assert html_to_text("  a \r\n\t b <p> </p><p></p><div>\n c </div>") == ("a b\nc", False)


def test_tags_with_quoted_angle_brackets_and_odd_markup() -> None:
    assert html_to_text('<a href="x>y" title=\'<b>\'>link</a>') == ("link", False)
    assert html_to_text("<!DOCTYPE html><?xml version='1.0'?><![if !mso]>x") == ("x", False)
    assert html_to_text("1 < 2 > 0") == ("1 < 2 > 0", False)


def test_cap_cuts_the_text_and_says_so() -> None:
    assert html_to_text("<p>abc</p><p>def</p>", 5) == ("abc\nd", True)
    assert html_to_text("<p>abc</p>", 3) == ("abc", False)


def test_plain_text_passes_through() -> None:
    assert html_to_text("no markup at all") == ("no markup at all", False)
