"""mark_snippet (index/postgres.py) marks the words a query matched in a
hit's first characters. It runs for every hit in the service's event loop,
so its cost must stay linear in the text: it used to build r"\\w*STEM\\w*"
per CJK lexeme, which backtracked over a long run of word characters (a
tracking token, a hex dump, CJK text without punctuation): 1.4 s per hit
for a query of ~145 CJK words, with the whole API waiting (found by an
audit). The marks themselves must not change: ``reference`` below is the
old pattern, compared on texts short enough for it."""

from __future__ import annotations

import re
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from nexarch_events.index.base import CONTINUOUS_RUN, HIGHLIGHT_END, HIGHLIGHT_START
from nexarch_events.index.postgres import mark_snippet


def reference(text: str, stems: list[str]) -> str:
    """The old marking of the whole text (no window), with "_" a separator
    as in documents (a word character is a letter or digit)."""
    words = re.compile("|".join(
        (rf"[^\W_]*{re.escape(stem)}[^\W_]*" if CONTINUOUS_RUN.fullmatch(stem)
         else rf"(?<![^\W_]){re.escape(stem)}[^\W_]*")
        for stem in sorted(set(stems), key=len, reverse=True)), re.IGNORECASE)
    return words.sub(lambda m: HIGHLIGHT_START + m.group() + HIGHLIGHT_END, text)


def lexemes(stems: list[str]) -> str:
    return " | ".join("'" + s.replace("'", "''") + "'" for s in stems)


def marked(text: str, stems: list[str]) -> str:
    return mark_snippet(text, lexemes(stems)).removeprefix("… ").removesuffix(" …")


def test_words_that_begin_with_a_stem_are_marked_whole() -> None:
    text = "Two invoices attached; reinvoice INVOICE 7"
    assert marked(text, ["invoic"]) == (
        f"Two {HIGHLIGHT_START}invoices{HIGHLIGHT_END} attached; reinvoice "
        f"{HIGHLIGHT_START}INVOICE{HIGHLIGHT_END} 7")


def test_a_cjk_stem_marks_the_run_it_is_in() -> None:
    text = "议程 我们明天开会议论这个问题 end"
    assert marked(text, ["会议"]) == (
        f"议程 {HIGHLIGHT_START}我们明天开会议论这个问题{HIGHLIGHT_END} end")


WORD_CHARS = st.sampled_from(list("abcxyzAB_09éü会议论我们'"))
TEXTS = st.lists(st.one_of(WORD_CHARS, st.sampled_from([" ", ",", "-", "\n"])),
                 max_size=60).map("".join)
STEMS = st.lists(st.lists(WORD_CHARS, min_size=1, max_size=3).map("".join),
                 min_size=1, max_size=4)


@settings(max_examples=400, deadline=None)
@given(TEXTS, STEMS)
def test_marks_are_those_of_the_old_pattern(text: str, stems: list[str]) -> None:
    # Texts under the snippet's length: the window is the whole text.
    assert marked(text, stems) == (reference(text, stems) if text else text)


def test_a_long_run_of_word_characters_costs_linear_time() -> None:
    # ~145 CJK stems (a 1,000-character query) and a 20,000-character run
    # that contains none of them: the old pattern needed minutes (1.4 s per
    # 2,000 characters, growing with the square); this is milliseconds.
    stems = [chr(0x4E00 + 2 * i) + chr(0x4E01 + 2 * i) for i in range(145)] + ["会议"]
    start = time.perf_counter()
    assert marked("z" * 20_000, stems) == "z" * 200
    assert mark_snippet("z" * 20_000 + " 会议论", lexemes(stems)).endswith(
        f" {HIGHLIGHT_START}会议论{HIGHLIGHT_END}")
    assert time.perf_counter() - start < 10, "quadratic marking is back"


def test_a_word_after_an_underscore_is_marked() -> None:
    """Documents split words at "_" (words_only), so "2024" finds
    report_2024.pdf; the snippet marked no word there (\\b does not start a
    word after "_"; a review)."""
    from nexarch_events.index.base import HIGHLIGHT_END, HIGHLIGHT_START
    from nexarch_events.index.postgres import mark_snippet

    marked = mark_snippet("see the file report_2024.pdf in the folder", "'2024'")
    assert f"report_{HIGHLIGHT_START}2024{HIGHLIGHT_END}.pdf" in marked
    assert HIGHLIGHT_START not in mark_snippet("xinvoices", "'invoic'")
