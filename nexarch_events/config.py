"""One TOML file plus environment overrides -> validated Settings.

The file's keys map one to one onto the ``NEXARCH_*`` variables
(``[queue] workers`` is ``NEXARCH_QUEUE_WORKERS``), so both go through the
same validation and every error names the key in both spellings. A variable
set in the environment wins over the file. API tokens live only in the file
(``[[api.tokens]]``), each a SHA-256 of the token, a file holding the token,
or the token itself (then the file is a secret: mind its permissions).

``nexarch-events config check`` prints the effective configuration with
every secret masked.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tomllib
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .errors import ConfigurationError
from .settings import (
    ApiSettings,
    ApiToken,
    ImportSettings,
    QueueSettings,
    Settings,
    exposed_secret,
)

log = logging.getLogger("nexarch_events.config")

#: Top-level keys of the file and their variables.
_TOP = {
    "database_url": "NEXARCH_DATABASE_URL", "database_url_file": "NEXARCH_DATABASE_URL_FILE",
    "listen_database_url": "NEXARCH_LISTEN_DATABASE_URL",
    "data_dir": "NEXARCH_DATA_DIR", "pool_size": "NEXARCH_POOL_SIZE",
    "command_timeout": "NEXARCH_COMMAND_TIMEOUT", "index_backend": "NEXARCH_INDEX_BACKEND",
    "manticore_url": "NEXARCH_MANTICORE_URL", "search_languages": "NEXARCH_SEARCH_LANGUAGES",
    "log_level": "NEXARCH_LOG_LEVEL", "log_format": "NEXARCH_LOG_FORMAT",
    "secret_key_file": "NEXARCH_SECRET_KEY_FILE",
    "manticore_timeout": "NEXARCH_MANTICORE_TIMEOUT",
}
_SECTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "queue": ("NEXARCH_QUEUE_", tuple(f.name for f in fields(QueueSettings))),
    "import": ("NEXARCH_IMPORT_", tuple(f.name for f in fields(ImportSettings))),
    "api": ("NEXARCH_API_", ("enabled", "host", "port", "max_streams",
                             "max_streams_per_token")),
    "retention": ("NEXARCH_RETENTION_", ("interval", "batch_size", "days")),
}


def load_settings(path: str | None = None,
                  environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from the file at ``path`` (or ``NEXARCH_CONFIG``), if any,
    overridden by the environment. Raises ConfigurationError naming the key."""
    env = dict(os.environ if environ is None else environ)
    path = path or env.get("NEXARCH_CONFIG") or None
    if path is None:
        return Settings.from_env(env)
    document = _read(path)
    merged, tokens = _flatten(path, document)
    merged.update(env)  # the environment wins
    settings = Settings.from_env(merged)
    if tokens:
        settings = replace(settings, api=replace(settings.api, tokens=tokens))
    return settings


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigurationError(f"config file {path} cannot be read: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        # A file that is not UTF-8 ended the command as a bug, exit 70 (an
        # operator audit): TOML is UTF-8 by definition.
        raise ConfigurationError(f"config file {path} is not valid TOML (UTF-8): "
                                 f"{exc}") from None


def _flatten(path: str, document: Mapping[str, Any]) -> tuple[dict[str, str],
                                                              tuple[ApiToken, ...]]:
    out: dict[str, str] = {}
    tokens: tuple[ApiToken, ...] = ()
    for key, value in document.items():
        if key in _TOP:
            out[_TOP[key]] = _scalar(path, key, value)
        elif key in _SECTIONS and isinstance(value, dict):
            prefix, names = _SECTIONS[key]
            for name, inner in value.items():
                if key == "api" and name == "tokens":
                    tokens = _tokens(path, inner)
                elif key == "retention" and name == "days":
                    out["NEXARCH_RETENTION_DAYS"] = _days(path, inner)
                elif name in names:
                    out[prefix + name.upper()] = _scalar(path, f"{key}.{name}", inner)
                else:
                    raise ConfigurationError(
                        f"{path}: unknown key {key}.{name}; known in [{key}]: "
                        f"{', '.join(names + (('tokens',) if key == 'api' else ()))}")
        elif key in _SECTIONS:
            raise ConfigurationError(f"{path}: {key} must be a table ([{key}]), got "
                                     f"{type(value).__name__}")
        else:
            raise ConfigurationError(
                f"{path}: unknown key {key!r}; known: "
                f"{', '.join(sorted(_TOP) + [f'[{s}]' for s in _SECTIONS])}")
    return out, tokens


def _scalar(path: str, key: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    raise ConfigurationError(f"{path}: {key} must be a string, number or boolean, "
                             f"got {type(value).__name__}")


def _days(path: str, table: object) -> str:
    """``[retention.days] acme = 365`` as NEXARCH_RETENTION_DAYS text."""
    if not isinstance(table, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in table.values()):
        raise ConfigurationError(f"{path}: retention.days must be a table of tenant = days "
                                 "([retention.days] acme = 365)")
    return ",".join(f"{tenant}={days}" for tenant, days in table.items())


def _tokens(path: str, entries: object) -> tuple[ApiToken, ...]:
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigurationError(f"{path}: api.tokens must be an array of tables "
                                 "([[api.tokens]])")
    out = []
    warned: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"{path}: api.tokens[{i}]"
        unknown = set(entry) - {"name", "tenant", "token", "token_file", "token_sha256"}
        if unknown:
            raise ConfigurationError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        given = [k for k in ("token", "token_file", "token_sha256") if k in entry]
        if len(given) != 1:
            raise ConfigurationError(f"{where}: give exactly one of token, token_file, "
                                     "token_sha256")
        if "token_sha256" in entry:
            digest = str(entry["token_sha256"]).lower()
        else:
            exposed = exposed_secret(path, "an API token in clear text") if "token" in entry \
                else exposed_secret(str(entry["token_file"]), "an API token")
            if exposed and exposed not in warned:
                warned.add(exposed)
                log.warning("%s (or use token_sha256)", exposed)
            secret = str(entry["token"]) if "token" in entry else _token_file(
                where, str(entry["token_file"]))
            if len(secret) < 16:
                raise ConfigurationError(f"{where}: the token must be at least 16 characters")
            digest = hashlib.sha256(secret.encode()).hexdigest()
        tenant = entry.get("tenant")
        out.append(ApiToken(name=str(entry.get("name", f"token{i}")), sha256=digest,
                            tenant=None if tenant in (None, "*") else str(tenant)))
    return tuple(out)


def _token_file(where: str, file: str) -> str:
    try:
        with open(file, encoding="utf-8") as handle:
            value = handle.read().strip()
    except OSError as exc:
        raise ConfigurationError(f"{where}: token_file {file} cannot be read: "
                                 f"{exc.strerror}") from None
    return value


def mask_url(url: str | None) -> str | None:
    """A database URL with every password replaced by ***: the one in the
    user part and any query parameter naming one (``?password=``,
    ``sslpassword=``), as libpq and asyncpg accept both."""
    if url is None:
        return None
    scheme, sep, rest = url.partition("://")
    userinfo, at, where = rest.rpartition("@")
    if sep and at and ":" in userinfo:
        # By the last "@": a password with an unencoded "/", "?" or "#"
        # ends urlsplit's netloc early, and it showed in clear (found by
        # an audit). The user part goes with it unless plainly a user.
        user = userinfo.split(":", 1)[0]
        user = user if user and not set(user) & set("/?#") else ""
        url = f"{scheme}://{user}:***@{where}"
    parts = urlsplit(url)
    if parts.password is not None and parts.password != "***":
        netloc = parts.netloc.rsplit("@", 1)
        user = (parts.username or "") + ":***"
        parts = parts._replace(netloc=f"{user}@{netloc[-1]}")
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if any("password" in key.lower() for key, _ in pairs):
            parts = parts._replace(query=urlencode(
                [(key, "***" if "password" in key.lower() else value) for key, value in pairs],
                safe="*"))
    return urlunsplit(parts)


def effective(settings: Settings) -> dict[str, Any]:
    """The configuration as a TOML-shaped dict, secrets masked."""
    api: ApiSettings = settings.api
    return {
        "database_url": mask_url(settings.database_url) or "(embedded Postgres)",
        "listen_database_url": mask_url(settings.listen_database_url),
        "data_dir": settings.data_dir, "pool_size": settings.pool_size,
        "command_timeout": settings.command_timeout, "index_backend": settings.index_backend,
        "manticore_url": mask_url(settings.manticore_url),
        "search_languages": list(settings.search_languages),
        "log_format": settings.log_format, "log_level": settings.log_level,
        "secret_key": "***" if settings.secret_key else None,
        "queue": {f.name: getattr(settings.queue, f.name) for f in fields(QueueSettings)},
        "import": {f.name: getattr(settings.importer, f.name) for f in fields(ImportSettings)},
        "retention": {"interval": settings.retention.interval,
                      "batch_size": settings.retention.batch_size,
                      "days": dict(settings.retention.days)},
        "api": {"enabled": api.enabled, "host": api.host, "port": api.port,
                "max_streams": api.max_streams,
                "max_streams_per_token": api.max_streams_per_token,
                "tokens": [{"name": t.name, "tenant": t.tenant or "* (admin)",
                            "token_sha256": t.sha256[:8] + "…"} for t in api.tokens]},
    }
