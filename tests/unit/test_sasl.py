"""OAuth2 SASL credentials, byte for byte against the specifications'
examples (RFC 7628 section 4.1; Google's XOAUTH2 protocol page)."""

from __future__ import annotations

import base64
import json

import pytest

from nexarch_events.errors import ImapAuthError
from nexarch_events.importer import sasl


def decoded(value: str) -> str:
    return base64.b64decode(value).decode()


def test_oauthbearer_matches_rfc_7628_example() -> None:
    value = sasl.initial_response(sasl.OAUTHBEARER, user="user@example.com",
                                  token="vF9dft4qmTc2Nvb3RlckBhbHRhdmlzdGEuY29tCg==",
                                  host="server.example.com", port=143)
    assert decoded(value) == ("n,a=user@example.com,\x01host=server.example.com\x01port=143"
                              "\x01auth=Bearer vF9dft4qmTc2Nvb3RlckBhbHRhdmlzdGEuY29tCg=="
                              "\x01\x01")


def test_xoauth2_matches_the_documented_format() -> None:
    value = sasl.initial_response(sasl.XOAUTH2, user="someuser@example.com",
                                  token="ya29.vF9dft4qmTc2Nvb3RlckBhdHRhdmlzdGEuY29tCg",
                                  host="imap.gmail.com", port=993)
    assert decoded(value) == ("user=someuser@example.com\x01auth=Bearer "
                              "ya29.vF9dft4qmTc2Nvb3RlckBhdHRhdmlzdGEuY29tCg\x01\x01")


def test_oauthbearer_escapes_comma_and_equals_in_the_user() -> None:
    value = sasl.initial_response(sasl.OAUTHBEARER, user="a,b=c@example.com", token="t",
                                  host="h", port=1)
    assert decoded(value).startswith("n,a=a=2Cb=3Dc@example.com,\x01")


@pytest.mark.parametrize(("user", "token"), [
    ("", "t"), ("evil\x01auth=Bearer x", "t"), ("u\r\n", "t"),
    ("u", ""), ("u", "a b"), ("u", "tok\x01en"),
])
def test_control_characters_cannot_smuggle_fields(user: str, token: str) -> None:
    for mechanism in (sasl.OAUTHBEARER, sasl.XOAUTH2):
        with pytest.raises(ImapAuthError):
            sasl.initial_response(mechanism, user=user, token=token, host="h", port=1)


def test_mechanism_is_chosen_from_capabilities() -> None:
    both = frozenset({"IMAP4rev1", "AUTH=XOAUTH2", "AUTH=OAUTHBEARER", "SASL-IR"})
    assert sasl.choose_mechanism(both) == sasl.OAUTHBEARER
    assert sasl.choose_mechanism(frozenset({"auth=xoauth2"})) == sasl.XOAUTH2
    with pytest.raises(ImapAuthError, match="AUTH=PLAIN"):
        sasl.choose_mechanism(frozenset({"IMAP4rev1", "AUTH=PLAIN"}))


def test_failure_continuation_is_described_without_trusting_it() -> None:
    challenge = base64.b64encode(json.dumps(
        {"status": "401", "schemes": "bearer", "scope": "https://mail.google.com/"}).encode())
    text = sasl.describe_failure(challenge.decode())
    assert "status 401" in text and "scope https://mail.google.com/" in text
    assert "not readable" in sasl.describe_failure("%%%not base64")
    assert sasl.describe_failure(base64.b64encode(b"[1]").decode()).startswith(
        "the server refused")
    assert sasl.FAILURE_ACK[sasl.OAUTHBEARER] == "AQ=="
