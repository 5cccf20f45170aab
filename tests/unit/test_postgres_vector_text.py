"""The Postgres backend's text preparation in Python: the CJK bigram split
and its fast path (a text of Latin-1 characters is handed over as it is)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nexarch_events.index.base import CONTINUOUS_RUN
from nexarch_events.index.postgres import _bigrams, split_continuous


def _split_by_regex_alone(text: str) -> str:
    return CONTINUOUS_RUN.sub(_bigrams, text)


@pytest.mark.parametrize(("text", "expected"), [
    ("plain ascii", "plain ascii"),
    ("Grüße, Straße", "Grüße, Straße"),                 # Latin-1: the fast path
    ("Preis 5 € – 会议室 heute", "Preis 5 € –  会议 议室 室  heute"),  # beyond Latin-1
    ("ÿ会", "ÿ 会 "),                                     # U+00FF then Han
    ("€ — “quoted”", "€ — “quoted”"),                    # beyond Latin-1, no CJK
    ("ภาษาไทย", " ภา าษ ษา าไ ไท ทย ย "),                  # Thai
])
def test_continuous_scripts_are_split_into_bigrams(text: str, expected: str) -> None:
    assert split_continuous(text) == expected


@given(st.text(alphabet=st.characters(max_codepoint=0x3134F), max_size=60))
def test_the_fast_path_agrees_with_the_regex(text: str) -> None:
    assert split_continuous(text) == _split_by_regex_alone(text)


def test_a_text_without_a_continuous_script_is_the_same_object() -> None:
    # _vector_text relies on identity to send NULL for "same as stored".
    for text in ("ascii", "Grüße", "€ — “x”", "x" * 100_000):
        assert split_continuous(text) is text
    assert split_continuous("会议") == " 会议 议 "
