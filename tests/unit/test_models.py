from __future__ import annotations

import pytest

from nexarch_events.errors import InvalidJobError
from nexarch_events.models import (
    MAX_PAYLOAD_BYTES,
    JobType,
    NewJob,
    encode_payload,
    storable_text,
    validate_tenant_slug,
)


@pytest.mark.parametrize("slug", ["a", "acme", "acme-corp", "a1", "9lives", "a" * 63])
def test_valid_slugs(slug: str) -> None:
    assert validate_tenant_slug(slug) == slug


@pytest.mark.parametrize("slug", ["", "A", "acme_corp", "-a", "a-", "a b", "ä", "a" * 64,
                                  "a/b", "a;drop table", "a\x00"])
def test_invalid_slugs(slug: str) -> None:
    with pytest.raises(InvalidJobError, match="tenant slug"):
        validate_tenant_slug(slug)


def test_slug_must_be_a_string() -> None:
    with pytest.raises(InvalidJobError, match="must be a string"):
        validate_tenant_slug(42)


def test_new_job_coerces_the_type_and_serializes_once() -> None:
    job = NewJob("delete", "acme", "m1")  # type: ignore[arg-type]
    assert job.job_type is JobType.DELETE
    assert job.payload_json == "{}"


def test_payload_size_is_measured_as_jsonb_prints_it() -> None:
    text = encode_payload({"a": [1, 2], "b": "ü"})
    assert text == '{"a": [1, 2], "b": "ü"}'


def test_payload_over_the_limit_names_the_limit() -> None:
    with pytest.raises(InvalidJobError, match=str(MAX_PAYLOAD_BYTES)):
        encode_payload({"x": "y" * MAX_PAYLOAD_BYTES})


def test_nested_nul_is_found() -> None:
    with pytest.raises(InvalidJobError, match="NUL"):
        encode_payload({"a": [{"b": ["ok", "no\x00"]}]})


def test_storable_text_escapes_controls_and_says_what_it_cut() -> None:
    # The importer's state and the queue's last_error share this rule.
    assert storable_text("line one\n\tline two", 100) == "line one\n\tline two"
    assert storable_text("a\x00b\x07c\rd\x7f", 100) == "a\\x00b\\x07c\\x0dd\\x7f"
    assert storable_text("a\udcffb\ud800", 100) == "a\\udcffb\\ud800"
    assert storable_text("a\udcffb", 100).encode()  # encodable, as Postgres needs
    clipped = storable_text("é" * 30, 10)
    assert clipped == "é" * 10 + "... [20 characters cut]"
    # The escapes count toward the limit: what is stored is what is measured.
    assert storable_text("\x00" * 5, 8) == "\\x00\\x00... [12 characters cut]"
