"""OAuth2 access tokens for IMAP sign-in (Microsoft 365, Gmail).

Two grants of RFC 6749 are supported, chosen by what is configured:

- ``client_credentials`` (section 4.4): app-only access, e.g. Microsoft 365
  with an application registered in Entra ID (client id + client secret, or
  a certificate: the client then proves itself with a signed JWT assertion,
  RFC 7523 section 2.2, as Entra ID documents for certificate credentials).
- ``refresh_token`` (section 6): delegated access, e.g. Gmail or a Microsoft
  user who consented once; the refresh token is a long-lived secret.

A ``TokenSource`` per mailbox caches its token until shortly before it
expires and fetches the next one ahead of time, so a connection signs in
with a token that will outlive the sign-in. Nothing the endpoint says is
taken on trust: a token must look like a bearer token (RFC 6750 b64token),
``expires_in`` is clamped, and an answer that is not a usable token is an
error, not a token.

Failures are sorted once, here: the provider refused (``OAuthRefused``:
revoked consent, wrong secret) or could not answer (``OAuthUnavailable``:
network, timeout, 5xx, 429, garbage). Either way the source waits at least
its backoff before it asks the endpoint again, whoever calls in between:
a mailbox that keeps being synced never turns into a request storm against
a provider. Secrets (client secret, refresh token, access token) never
appear in an error message or a log line.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import logging
import re
import ssl
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import httpx
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from ..errors import ConfigurationError, OAuthRefused, OAuthUnavailable
from . import secrets

log = logging.getLogger(__name__)

#: RFC 6750 section 2.1: what a bearer token may consist of. A token with
#: anything else (a space, a control character) would break the SASL string.
_B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
MAX_TOKEN_CHARS = 16_384
#: What is assumed when the endpoint does not say how long a token lives.
DEFAULT_LIFETIME_S = 300.0
#: ``expires_in`` is clamped to this range: a token claimed to live for a
#: year is still refreshed daily; one that "lives" 0 s is not fetched in a loop.
MIN_LIFETIME_S, MAX_LIFETIME_S = 30.0, 86_400.0
#: Refresh this long before expiry at most (and after 80 % of the lifetime).
REFRESH_AHEAD_S = 300.0
#: Waits between failed requests: doubling from the floor up to the cap.
#: A refusal waits longer: the provider will not change its mind in seconds.
BACKOFF_FLOOR_S, BACKOFF_CAP_S = 5.0, 300.0
REFUSED_FLOOR_S = 60.0
_REFUSALS = frozenset({"invalid_grant", "invalid_client", "unauthorized_client",
                       "invalid_scope", "unsupported_grant_type", "invalid_request",
                       "access_denied", "consent_required", "interaction_required"})
_SHOWN = re.compile(r"[^\x20-\x7e]+")
CLIENT_ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
#: How long a client assertion is valid (Entra ID accepts up to 10 minutes).
ASSERTION_LIFETIME_S = 300


@dataclass(frozen=True, slots=True)
class OAuthClient:
    """What a mailbox signs in with. ``client_secret_ref`` and
    ``refresh_token_ref`` are secret references (``env:``, ``file:`` or
    ``sealed:``, as IMAP passwords are); with a refresh token the
    refresh-token grant is used, without one the client-credentials grant."""

    token_url: str
    client_id: str
    client_secret_ref: str | None = None
    refresh_token_ref: str | None = None
    #: Space-separated scopes. Microsoft 365 app-only:
    #: ``https://outlook.office365.com/.default``; Gmail: ``https://mail.google.com/``.
    scope: str | None = None
    #: PEM bundle to trust for the token endpoint instead of the system's.
    ca_file: str | None = None
    #: A secret reference to a PEM holding the client's private key (RSA) and
    #: its certificate: signs a JWT client assertion instead of a secret.
    client_certificate_ref: str | None = None

    def __post_init__(self) -> None:
        check_token_url(self.token_url)
        if not self.client_id or len(self.client_id) > 512 or _SHOWN.search(self.client_id):
            raise ConfigurationError("the OAuth client id must be 1-512 printable characters")
        if self.refresh_token_ref is None and self.client_secret_ref is None \
                and self.client_certificate_ref is None:
            raise ConfigurationError(
                "OAuth sign-in needs a client secret or certificate (client-credentials "
                "grant) or a refresh token (refresh-token grant); give "
                "--oauth-secret-env/-file, --oauth-certificate-env/-file or "
                "--oauth-refresh-token-env/-file")
        if self.client_secret_ref is not None and self.client_certificate_ref is not None:
            raise ConfigurationError("give the OAuth client a secret or a certificate, "
                                     "not both")

    @property
    def grant(self) -> str:
        return "refresh_token" if self.refresh_token_ref else "client_credentials"


def check_token_url(url: str) -> None:
    """Token endpoints are HTTPS; plain HTTP only on this machine (tests, a
    local proxy), since the request carries the client secret."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        raise ConfigurationError(f"the OAuth token URL {url[:200]!r} is not a URL") from None
    if parsed.scheme == "https" and parsed.host:
        return
    if parsed.scheme == "http" and _is_loopback(parsed.host):
        return
    raise ConfigurationError(
        f"the OAuth token URL {url[:200]!r} must be https:// (plain http only for a "
        "loopback address): the request carries the client secret")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RefreshTokenStore(Protocol):
    """Keeps the newest refresh token of each chain (a client and the
    refresh token registered for it) beyond one token source: a provider
    may revoke a refresh token once it has issued the next one, and the
    registered one expires (Microsoft: 90 days after it was issued, however
    often it was used). importer/refresh_tokens.py has the implementations.
    Neither method raises for a failure of its own (it logs it)."""

    async def load(self, chain: bytes) -> str | None: ...

    async def save(self, chain: bytes, token: str) -> bool:
        """True once ``token`` is kept."""


def refresh_chain(client: OAuthClient, registered: str) -> bytes:
    """The key a chain's newest refresh token is kept under: a digest of
    the client and the registered token, so a token registered anew (the
    user consented again) starts a new chain."""
    return hashlib.sha256("\0".join(("nexarch-oauth-refresh/1", client.token_url,
                                     client.client_id, registered)).encode()).digest()


@dataclass(frozen=True, slots=True)
class AccessToken:
    value: str
    #: On the source's clock (``trio.current_time`` unless injected).
    expires_at: float
    refresh_at: float

    def __repr__(self) -> str:  # never print the token itself
        return f"AccessToken(expires_at={self.expires_at:.0f}, refresh_at={self.refresh_at:.0f})"


class TokenSource:
    """The current access token of one OAuth client, fetched when needed.

    ``token()`` blocks on at most one request to the endpoint at a time
    (concurrent callers wait for the same answer). Cancelling it abandons the
    request; the cache is unchanged. The source owns its httpx client until
    ``aclose``. ``transport`` replaces the network (tests script the wire);
    ``clock`` replaces ``trio.current_time``.
    """

    def __init__(self, client: OAuthClient, *, secret_key: str | None,
                 timeout: float = 30.0, transport: httpx.AsyncBaseTransport | None = None,
                 clock: Callable[[], float] | None = None,
                 environ: Mapping[str, str] | None = None,
                 refresh_store: RefreshTokenStore | None = None) -> None:
        """``refresh_store``: where a rotated refresh token is kept for
        the next source of the same chain (the service's is Postgres,
        sealed); without one it lives as long as this source."""
        self.client = client
        self._secret_key = secret_key
        self._environ = environ
        self._clock = clock or trio.current_time
        self._lock = trio.Lock()
        self._token: AccessToken | None = None
        #: A refresh token the provider rotated to (Microsoft does): presented
        #: at this source's next refresh, and kept in ``refresh_store``.
        self._rotated_refresh_token: str | None = None
        self._store = refresh_store
        #: The store could not keep this source's rotation: it holds an
        #: older token than ``_rotated_refresh_token``.
        self._store_behind = False
        self._failures = 0
        self._retry_at = float("-inf")
        self._last_error: OAuthRefused | OAuthUnavailable | None = None
        #: Tokens the IMAP server refused in a row (``reject``), and a
        #: digest of the last one.
        self._rejections = 0
        self._last_rejected: bytes | None = None
        #: Requests made to the endpoint (for metrics and tests).
        self.requests = 0
        verify: ssl.SSLContext | bool = True
        if client.ca_file:
            try:
                verify = ssl.create_default_context(cafile=client.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigurationError(
                    f"the OAuth CA file {client.ca_file} cannot be loaded: {exc}") from None
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout), verify=verify,
                                       transport=transport, follow_redirects=False)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> TokenSource:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def seconds_left(self) -> float | None:
        """How long the cached token stays valid (None: none cached). A
        connection that stays signed in (IDLE) re-authenticates before this."""
        if self._token is None:
            return None
        return self._token.expires_at - self._clock()

    def seconds_until_refresh(self) -> float | None:
        """How long until the cached token is due to be replaced (None: none
        cached); a session signed in with it should end by then."""
        if self._token is None:
            return None
        return self._token.refresh_at - self._clock()

    async def token(self) -> str:
        """A valid access token: the cached one, or a new one from the
        endpoint. Raises ``OAuthRefused`` / ``OAuthUnavailable``; within the
        backoff after a failure, raises the same error again without asking
        the endpoint (a still-valid cached token is returned meanwhile)."""
        async with self._lock:
            now = self._clock()
            current = self._token
            if current is not None and now < current.refresh_at:
                return current.value
            if now < self._retry_at:
                if current is not None and now < current.expires_at:
                    return current.value
                assert self._last_error is not None
                raise type(self._last_error)(str(self._last_error))
            try:
                self._token = await self._fetch()
            except (OAuthRefused, OAuthUnavailable) as exc:
                self._failures += 1
                floor = REFUSED_FLOOR_S if isinstance(exc, OAuthRefused) else BACKOFF_FLOOR_S
                wait = min(BACKOFF_CAP_S, floor * 2 ** (self._failures - 1))
                if isinstance(exc, OAuthUnavailable):
                    wait = max(wait, min(exc.retry_after, BACKOFF_CAP_S))
                self._retry_at = self._clock() + wait
                self._last_error = exc
                log.warning("oauth token request failed client_id=%s grant=%s retry_in=%.0fs: %s",
                            self.client.client_id, self.client.grant, wait, exc)
                if current is not None and self._clock() < current.expires_at:
                    return current.value
                raise
            self._failures = 0
            self._retry_at = float("-inf")
            self._last_error = None
            return self._token.value

    def reject(self, token: str, reason: str) -> None:
        """The IMAP server refused ``token`` (revoked, expired early, or not
        valid for this mailbox): it is dropped from the cache, so the next
        ``token()`` asks the endpoint for a new one. A second refusal before
        any sign-in succeeds is the provider's answer, not a stale token:
        the source then waits its refusal backoff (``REFUSED_FLOOR_S``
        doubling) before it asks again, and ``token()`` raises
        ``OAuthRefused`` meanwhile. A token counts once, however many
        sign-ins it failed (a source shared by an account's folders: each
        folder's sign-in with a revoked token is refused). Never blocks."""
        if self._token is not None and self._token.value == token:
            self._token = None
        digest = hashlib.sha256(token.encode("utf-8", "replace")).digest()
        if digest == self._last_rejected:
            return
        self._last_rejected = digest
        self._rejections += 1
        if self._rejections < 2:
            return
        self._failures += 1
        wait = min(BACKOFF_CAP_S, REFUSED_FLOOR_S * 2 ** (self._failures - 1))
        self._retry_at = self._clock() + wait
        self._last_error = OAuthRefused(
            f"sign-in refused by the provider: the IMAP server refused {self._rejections} "
            f"access token(s) in a row ({_shown(reason, 300)}); next token in {wait:.0f} s")
        log.warning("oauth token refused by the IMAP server client_id=%s grant=%s "
                    "retry_in=%.0fs", self.client.client_id, self.client.grant, wait)

    def accepted(self) -> None:
        """A sign-in with the current token succeeded: refusals start over."""
        self._rejections = 0

    def _form(self, refresh_token: str | None) -> dict[str, str]:
        c = self.client
        form = {"client_id": c.client_id, "grant_type": c.grant}
        if c.client_secret_ref:
            form["client_secret"] = self._secret(c.client_secret_ref)
        if c.client_certificate_ref:
            form["client_assertion_type"] = CLIENT_ASSERTION_TYPE
            form["client_assertion"] = client_assertion(
                self._secret(c.client_certificate_ref), client_id=c.client_id,
                audience=c.token_url)
        if refresh_token is not None:
            form["refresh_token"] = refresh_token
        if c.scope:
            form["scope"] = c.scope
        return form

    def _secret(self, ref: str) -> str:
        return secrets.resolve(ref, key=self._secret_key, environ=self._environ)

    async def _refresh_token(self) -> tuple[str, str] | None:
        """(the registered refresh token, the one to present): the newest
        of its chain, this source's own rotation first, then the store's."""
        ref = self.client.refresh_token_ref
        if ref is None:
            return None
        registered = self._secret(ref)
        # The store first: another source of the chain (a CLI sign-in, a
        # process restarted) may have rotated it since this one did, and the
        # provider then refuses this one's (a review).
        if self._store is not None and not self._store_behind:
            newest = await self._store.load(refresh_chain(self.client, registered))
            if newest is not None:
                return registered, newest
        return registered, self._rotated_refresh_token or registered

    async def _keep(self, registered: str, rotated: str) -> None:
        self._rotated_refresh_token = rotated
        if self._store is None:
            return
        # Shielded: the provider may have revoked the one presented.
        kept = False
        with trio.move_on_after(10, shield=True):
            kept = await self._store.save(refresh_chain(self.client, registered), rotated)
        if not kept:
            log.warning("the OAuth refresh token of client_id=%s could not be kept within "
                        "10 s: this source presents it, but another one (or a restart) "
                        "presents an older one, which the provider may refuse",
                        self.client.client_id)
        self._store_behind = not kept

    async def _fetch(self) -> AccessToken:
        refresh = await self._refresh_token()
        form = self._form(None if refresh is None else refresh[1])
        where = f"token endpoint {httpx.URL(self.client.token_url).host}"
        self.requests += 1
        try:
            response = await self._http.post(self.client.token_url, data=form,
                                             headers={"accept": "application/json"})
        except httpx.TimeoutException:
            raise OAuthUnavailable(f"{where}: no answer in time") from None
        except httpx.TransportError as exc:
            # The message of a transport error names the host, not the body.
            raise OAuthUnavailable(f"{where}: {type(exc).__name__}: {exc}") from None
        except httpx.HTTPError as exc:
            # E.g. a body that does not decode as its Content-Encoding says:
            # the provider's fault, never the service's end (it exited 70,
            # after every restart: a retry-loop audit).
            raise OAuthUnavailable(f"{where}: the answer cannot be read "
                                   f"({type(exc).__name__})") from None
        issued_at = self._clock()
        body = _json_object(response)
        if response.status_code != 200:
            raise _refusal_or_outage(where, response, body,
                                     [v for k, v in form.items() if k in _SECRET_FIELDS])
        if body is None:
            raise OAuthUnavailable(f"{where} answered 200 without a JSON object")
        # Kept first: the provider may have revoked the one presented, even
        # if the rest of this answer is of no use.
        rotated = body.get("refresh_token")
        if refresh is not None and isinstance(rotated, str) and rotated != refresh[1] \
                and _B64TOKEN.fullmatch(rotated) and len(rotated) <= MAX_TOKEN_CHARS:
            await self._keep(refresh[0], rotated)
        token = body.get("access_token")
        if not isinstance(token, str) or not (0 < len(token) <= MAX_TOKEN_CHARS) \
                or not _B64TOKEN.fullmatch(token):
            raise OAuthUnavailable(f"{where} answered 200 without a usable access_token")
        kind = body.get("token_type", "Bearer")
        if not isinstance(kind, str) or kind.lower() != "bearer":
            raise OAuthUnavailable(f"{where} issued a token of type {_shown(kind)!r}, "
                                   "not Bearer")
        lifetime = _lifetime(body.get("expires_in"))
        log.info("oauth token issued client_id=%s grant=%s lifetime=%.0fs",
                 self.client.client_id, self.client.grant, lifetime)
        return AccessToken(value=token, expires_at=issued_at + lifetime,
                           refresh_at=issued_at + lifetime - min(REFRESH_AHEAD_S,
                                                                 0.2 * lifetime))


def _json_object(response: httpx.Response) -> dict[str, object] | None:
    try:
        value = json.loads(response.content[:1_000_000])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _lifetime(value: object) -> float:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)  # some endpoints send it as a string
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return DEFAULT_LIFETIME_S
    return min(MAX_LIFETIME_S, max(MIN_LIFETIME_S, float(value)))


def _shown(value: object, limit: int = 200) -> str:
    """Provider text fit for a log line and a mailbox state: printable, short."""
    return _SHOWN.sub(" ", str(value))[:limit].strip()


#: Form fields whose values are secrets: a provider may echo the request in
#: its error text, which is logged and stored as the mailbox's last_error.
_SECRET_FIELDS = frozenset({"client_secret", "client_assertion", "refresh_token"})


def _refusal_or_outage(where: str, response: httpx.Response, body: dict[str, object] | None,
                       sent: list[str]) -> OAuthRefused | OAuthUnavailable:
    """The provider's error, with whatever secret it echoes from ``sent``
    left out (before the text is cut to length: a cut secret matches no
    more)."""

    def said_by(key: str) -> str:
        text = str(body.get(key, "")) if body else ""
        for secret in sent:
            if len(secret) >= 4:
                text = text.replace(secret, "***")
        return _shown(text)

    status = response.status_code
    code = said_by("error")
    detail = said_by("error_description")
    said = f"{code}: {detail}" if code and detail else code or detail or f"HTTP {status}"
    if status == 429 or status >= 500:
        return OAuthUnavailable(f"{where} is unavailable (HTTP {status}): {said}",
                                retry_after=_retry_after(response.headers.get("retry-after")))
    if 400 <= status < 500 and (code in _REFUSALS or status in (400, 401, 403)):
        return OAuthRefused(f"sign-in refused by the provider ({where}, HTTP {status}): {said}")
    return OAuthUnavailable(f"{where} answered HTTP {status}: {said}")


def _retry_after(value: str | None) -> float:
    """Retry-After in seconds (the HTTP-date form is treated as absent);
    the caller still applies its own floor and cap."""
    if value and value.strip().isascii() and value.strip().isdigit():
        return float(value.strip())
    return 0.0


def client_assertion(pem: str, *, client_id: str, audience: str,
                     now: float | None = None) -> str:
    """A JWT (RS256) asserting ``client_id`` to the token endpoint
    ``audience``, signed with the private key in ``pem`` and naming its
    certificate by SHA-1 and SHA-256 thumbprint (``x5t``, ``x5t#S256``), as
    Entra ID's certificate credentials expect. ``pem`` holds both the key and
    the certificate. The claims use the wall clock, which the endpoint checks."""
    try:
        key = serialization.load_pem_private_key(pem.encode(), password=None)
        cert = x509.load_pem_x509_certificate(pem.encode())
    except ValueError:
        raise ConfigurationError("the OAuth client certificate must be a PEM with an "
                                 "unencrypted private key and its certificate") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ConfigurationError("the OAuth client certificate's key must be an RSA key")
    der = cert.public_bytes(serialization.Encoding.DER)
    issued = int(time.time() if now is None else now)
    header = {"alg": "RS256", "typ": "JWT",
              # SHA-1 here names the certificate (x5t); it protects nothing.
              "x5t": _b64url(hashlib.sha1(der).digest()),
              "x5t#S256": _b64url(hashlib.sha256(der).digest())}
    claims = {"aud": audience, "iss": client_id, "sub": client_id, "jti": str(uuid.uuid4()),
              "iat": issued, "nbf": issued, "exp": issued + ASSERTION_LIFETIME_S}
    signing_input = (_b64url(json.dumps(header, separators=(",", ":")).encode()) + "."
                     + _b64url(json.dumps(claims, separators=(",", ":")).encode()))
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return signing_input + "." + _b64url(signature)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")
