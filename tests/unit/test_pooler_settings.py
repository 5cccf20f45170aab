"""NEXARCH_LISTEN_DATABASE_URL: validated, masked, and it turns the
prepared-statement cache off."""

from __future__ import annotations

import pytest

from nexarch_events.config import effective, load_settings
from nexarch_events.errors import ConfigurationError
from nexarch_events.settings import Settings

POOLED = "postgresql://app:hunter2@pgbouncer:6432/archive"
DIRECT = "postgresql://app:direct-pw@postgres:5432/archive"


def test_a_listen_url_means_a_pooler_in_front_of_the_database_url() -> None:
    settings = Settings.from_env({"NEXARCH_DATABASE_URL": POOLED,
                                  "NEXARCH_LISTEN_DATABASE_URL": DIRECT})
    assert settings.listen_database_url == DIRECT
    assert settings.statement_cache_size == 0
    assert Settings.from_env({"NEXARCH_DATABASE_URL": DIRECT}).statement_cache_size == 100
    assert "direct-pw" not in str(effective(settings)) and "direct-pw" not in repr(settings)


def test_every_pool_behind_a_pooler_gets_a_direct_url_for_its_session_locks() -> None:
    """The importer's run lock and the retention lock are session locks:
    ``Database.session`` takes them on the direct URL (tests/integration/
    test_pooler.py shows what a pooler does to them otherwise)."""
    pooled = Settings.from_env({"NEXARCH_DATABASE_URL": POOLED,
                                "NEXARCH_LISTEN_DATABASE_URL": DIRECT,
                                "NEXARCH_COMMAND_TIMEOUT": "7"}).pool_options()
    assert pooled == {"command_timeout": 7.0, "statement_cache_size": 0, "session_dsn": DIRECT}
    direct = Settings.from_env({"NEXARCH_DATABASE_URL": DIRECT}).pool_options()
    assert direct["session_dsn"] is None and direct["statement_cache_size"] == 100


def test_a_listen_url_needs_a_database_url_and_a_postgres_scheme() -> None:
    with pytest.raises(ConfigurationError, match="NEXARCH_LISTEN_DATABASE_URL"):
        Settings.from_env({"NEXARCH_LISTEN_DATABASE_URL": DIRECT})
    with pytest.raises(ConfigurationError, match="NEXARCH_LISTEN_DATABASE_URL"):
        Settings.from_env({"NEXARCH_DATABASE_URL": POOLED,
                           "NEXARCH_LISTEN_DATABASE_URL": "mysql://x"})


def test_the_configuration_file_knows_the_key(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "n.toml"  # type: ignore[operator]
    path.write_text(f'database_url = "{POOLED}"\nlisten_database_url = "{DIRECT}"\n')
    assert load_settings(str(path), environ={}).listen_database_url == DIRECT
