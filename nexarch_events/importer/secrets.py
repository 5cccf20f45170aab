"""IMAP passwords: never in Postgres in clear text, never in a log line.

A mailbox row holds one of
- ``env:NAME``: read from the service's environment at connect time;
- ``file:/path``: read from a file (compose/Kubernetes secrets);
- ``sealed:v1:<token>``: the password encrypted (Fernet: AES-128-CBC +
  HMAC-SHA256) with the operator's key (NEXARCH_SECRET_KEY_FILE), so a
  database dump alone does not reveal it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from cryptography.fernet import Fernet, InvalidToken

from ..errors import ConfigurationError

_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SEALED_PREFIX = "sealed:v1:"


def new_key() -> str:
    """A fresh key for NEXARCH_SECRET_KEY_FILE."""
    return Fernet.generate_key().decode()


def _fernet(key: str | None) -> Fernet:
    if not key:
        raise ConfigurationError(
            "storing a password needs the operator's key: set NEXARCH_SECRET_KEY_FILE to a file "
            "holding one (make one with `nexarch-events mailbox new-key`), or reference the "
            "password with --password-env / --password-file instead")
    try:
        return Fernet(key.encode())
    except (ValueError, TypeError):
        raise ConfigurationError(
            "the secret key (NEXARCH_SECRET_KEY_FILE) is not a valid key: it must be 32 "
            "url-safe base64-encoded bytes, as `nexarch-events mailbox new-key` prints") from None


def reference_env(name: str) -> str:
    if not _ENV.fullmatch(name):
        raise ConfigurationError(f"--password-env {name[:60]!r} is not an environment "
                                 "variable name")
    return f"env:{name}"


def reference_file(path: str) -> str:
    if not os.path.isabs(path):
        raise ConfigurationError(f"--password-file must be an absolute path, got {path[:200]!r}")
    return f"file:{path}"


def seal(password: str, key: str | None) -> str:
    if not password:
        raise ConfigurationError("the password is empty")
    return SEALED_PREFIX + _fernet(key).encrypt(password.encode()).decode()


def resolve(ref: str, *, key: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The password a reference stands for. Errors name the reference kind
    and where to fix it, never a secret."""
    env = os.environ if environ is None else environ
    if ref.startswith("env:"):
        name = ref[4:]
        value = env.get(name)
        if not value:
            raise ConfigurationError(f"the password variable {name} is not set in the "
                                     "service's environment")
        return value
    if ref.startswith("file:"):
        path = ref[5:]
        try:
            with open(path, encoding="utf-8") as handle:
                value = handle.read().rstrip("\r\n")
        except OSError as exc:
            raise ConfigurationError(f"the password file {path} cannot be read: "
                                     f"{exc.strerror}") from None
        if not value:
            raise ConfigurationError(f"the password file {path} is empty")
        return value
    if ref.startswith(SEALED_PREFIX):
        try:
            return _fernet(key).decrypt(ref[len(SEALED_PREFIX):].encode()).decode()
        except InvalidToken:
            raise ConfigurationError(
                "a stored password cannot be decrypted with NEXARCH_SECRET_KEY_FILE's key "
                "(another key sealed it); add the mailbox again") from None
    raise ConfigurationError("unknown password reference kind (expected env:, file: or sealed:)")
