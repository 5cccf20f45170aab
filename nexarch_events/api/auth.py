"""Bearer tokens and tenant scope.

A token is checked by the SHA-256 of what the client sent, compared with
every configured token's hash in constant time (``hmac.compare_digest``,
no early exit), so neither the token nor which entry matched leaks through
timing. A token of a tenant sees that tenant only; an admin token (no
tenant) sees every tenant, or the one it names with ``?tenant=``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InvalidJobError
from ..models import validate_tenant_slug
from ..settings import ApiToken
from .asgi import ApiError, Request

_CHALLENGE = ("www-authenticate", 'Bearer realm="nexarch-events"')


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is asking: the token's name and its tenant (None: admin)."""

    name: str
    tenant: str | None

    @property
    def is_admin(self) -> bool:
        return self.tenant is None


def authenticate(request: Request, tokens: Sequence[ApiToken]) -> Principal:
    """The caller's principal, or ApiError 401."""
    header = request.header("authorization")
    if header is None:
        raise ApiError(401, "missing bearer token: send the header 'Authorization: Bearer "
                            "<token>'", [_CHALLENGE])
    scheme, _, presented = header.strip().partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        raise ApiError(401, "the Authorization header must be 'Bearer <token>'", [_CHALLENGE])
    # Headers arrive decoded as latin-1: encoding back gives the bytes sent.
    digest = hashlib.sha256(presented.encode("latin-1")).hexdigest()
    found: ApiToken | None = None
    for token in tokens:
        if hmac.compare_digest(digest, token.sha256):
            found = token
    if found is None:
        raise ApiError(401, "unknown bearer token", [_CHALLENGE])
    return Principal(found.name, found.tenant)


def tenant_scope(principal: Principal, request: Request, *, required: bool) -> str | None:
    """The tenant this request reads: a tenant token's own (``?tenant=`` may
    repeat it, never name another); an admin's ``?tenant=``, or None for
    every tenant unless ``required``."""
    asked = request.param("tenant")
    if asked is not None:
        try:
            validate_tenant_slug(asked)
        except InvalidJobError as exc:
            raise ApiError(400, f"query parameter 'tenant': {exc}") from None
    if principal.tenant is not None:
        if asked is not None and asked != principal.tenant:
            raise ApiError(403, f"token {principal.name!r} belongs to tenant "
                                f"{principal.tenant!r}; it cannot read tenant {asked!r}")
        return principal.tenant
    if asked is None and required:
        raise ApiError(400, f"{request.path} needs a tenant: admin token {principal.name!r} "
                            "must add ?tenant=<slug>")
    return asked


def require_admin(principal: Principal, request: Request) -> None:
    if not principal.is_admin:
        raise ApiError(403, f"{request.path} needs an admin token (one without a tenant); "
                            f"token {principal.name!r} belongs to tenant {principal.tenant!r}")
