"""IMAP password references and sealing (nexarch_events/importer/secrets.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexarch_events.errors import ConfigurationError
from nexarch_events.importer import secrets
from nexarch_events.settings import Settings


def test_env_and_file_references(tmp_path: Path) -> None:
    assert secrets.resolve(secrets.reference_env("PW"), key=None, environ={"PW": "s3"}) == "s3"
    path = tmp_path / "pw"
    path.write_text("from-file\n")
    assert secrets.resolve(secrets.reference_file(str(path)), key=None) == "from-file"


def test_errors_name_the_reference_never_the_secret(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="PW is not set"):
        secrets.resolve("env:PW", key=None, environ={})
    with pytest.raises(ConfigurationError, match="cannot be read"):
        secrets.resolve(f"file:{tmp_path}/missing", key=None)
    with pytest.raises(ConfigurationError, match="absolute"):
        secrets.reference_file("relative/pw")
    with pytest.raises(ConfigurationError):
        secrets.reference_env("NOT-A-NAME")


def test_sealed_round_trip_and_wrong_key() -> None:
    key = secrets.new_key()
    sealed = secrets.seal("hunter2", key)
    assert sealed.startswith("sealed:v1:") and "hunter2" not in sealed
    assert secrets.resolve(sealed, key=key) == "hunter2"
    with pytest.raises(ConfigurationError, match="cannot be decrypted") as info:
        secrets.resolve(sealed, key=secrets.new_key())
    assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigurationError, match="NEXARCH_SECRET_KEY_FILE"):
        secrets.seal("hunter2", None)


def test_import_settings_from_env(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text(secrets.new_key())
    settings = Settings.from_env({"NEXARCH_IMPORT_IDLE_LIMIT": "7",
                                  "NEXARCH_IMPORT_IMAP_TIMEOUT": "12.5",
                                  "NEXARCH_SECRET_KEY_FILE": str(key)})
    assert settings.importer.idle_limit == 7 and settings.importer.imap_timeout == 12.5
    assert settings.secret_key == key.read_text()
    assert key.read_text() not in repr(settings)
    with pytest.raises(ConfigurationError, match=r"import\.idle_limit"):
        Settings.from_env({"NEXARCH_IMPORT_IDLE_LIMIT": "0"})
