"""SASL mechanisms for OAuth2 sign-in over IMAP: pure functions, no I/O.

- ``OAUTHBEARER`` (RFC 7628), the standard one.
- ``XOAUTH2``, the older form Gmail and Microsoft 365 document and accept.

``AUTHENTICATE <mechanism> <initial response>`` sends the whole credential
at once (SASL-IR, RFC 4959); without SASL-IR the same bytes follow the
server's empty ``+`` continuation. On failure both mechanisms send a ``+``
continuation carrying a base64 JSON error, which the client must answer
(``FAILURE_ACK``) before the server completes the command with NO.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field

from ..errors import ImapAuthError

OAUTHBEARER, XOAUTH2 = "OAUTHBEARER", "XOAUTH2"
#: What the client answers to the error continuation: RFC 7628 section 3.2.3
#: asks for a single %x01; XOAUTH2 expects an empty response.
FAILURE_ACK = {OAUTHBEARER: base64.b64encode(b"\x01").decode(), XOAUTH2: ""}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def choose_mechanism(capabilities: frozenset[str]) -> str:
    """OAUTHBEARER where offered, else XOAUTH2; an error naming what the
    server does offer when it has neither."""
    caps = {c.upper() for c in capabilities}
    for mechanism in (OAUTHBEARER, XOAUTH2):
        if f"AUTH={mechanism}" in caps:
            return mechanism
    offered = sorted(c for c in caps if c.startswith("AUTH=")) or ["no AUTH= mechanism"]
    raise ImapAuthError("the server offers no OAuth2 sign-in (neither AUTH=OAUTHBEARER nor "
                        f"AUTH=XOAUTH2; it offers {', '.join(offered)})")


def initial_response(mechanism: str, *, user: str, token: str, host: str, port: int) -> str:
    """The base64 credential for ``mechanism``. The user name and token are
    checked: a control character would end a SASL field early and let a
    value smuggle in fields of its own."""
    if not user or _CONTROL.search(user):
        raise ImapAuthError("the IMAP user name for OAuth2 sign-in is empty or has a "
                            "control character")
    if not token or _CONTROL.search(token) or " " in token:
        raise ImapAuthError("the OAuth2 access token is empty or malformed")
    if mechanism == XOAUTH2:
        raw = f"user={user}\x01auth=Bearer {token}\x01\x01"
    elif mechanism == OAUTHBEARER:
        # RFC 5801 gs2-header: no channel binding, the authorization identity
        # with "," and "=" escaped as =2C and =3D.
        saslname = user.replace("=", "=3D").replace(",", "=2C")
        raw = (f"n,a={saslname},\x01host={host}\x01port={port}"
               f"\x01auth=Bearer {token}\x01\x01")
    else:
        raise ImapAuthError(f"unknown SASL mechanism {mechanism!r}")
    return base64.b64encode(raw.encode("utf-8")).decode("ascii")


def describe_failure(challenge: str) -> str:
    """The server's error continuation in words (``status``, ``scope``), or
    what was wrong with it. Never echoes more than a short printable text."""
    try:
        value = json.loads(base64.b64decode(challenge.strip(), validate=True))
    except (binascii.Error, ValueError):
        return "the server refused the token (its error detail is not readable)"
    if not isinstance(value, dict):
        return "the server refused the token"
    parts = [f"{key} {str(value[key])[:80]}" for key in ("status", "scope", "schemes")
             if key in value]
    text = ", ".join(parts) if parts else "no detail"
    return "the server refused the token (" + re.sub(r"[^\x20-\x7e]", " ", text) + ")"


@dataclass(frozen=True, slots=True)
class OAuthLogin:
    """An OAuth2 sign-in for ``ImapSession.open_sasl``: the user and a
    current access token (from ``oauth.TokenSource``)."""

    username: str
    token: str = field(repr=False)

    def credential(self, capabilities: frozenset[str], host: str, port: int
                   ) -> tuple[str, str, str]:
        mechanism = choose_mechanism(capabilities)
        return (mechanism, initial_response(mechanism, user=self.username, token=self.token,
                                            host=host, port=port), FAILURE_ACK[mechanism])

    def describe_failure(self, challenge: str) -> str:
        return describe_failure(challenge)
