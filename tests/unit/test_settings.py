from __future__ import annotations

import pytest

from nexarch_events.errors import ConfigurationError
from nexarch_events.settings import QueueSettings, Settings


def test_environment_overrides() -> None:
    settings = Settings.from_env({"NEXARCH_DATABASE_URL": "postgresql://x/y",
                                  "NEXARCH_QUEUE_WORKERS": "8",
                                  "NEXARCH_QUEUE_STALE_AFTER": "12.5"})
    assert settings.database_url == "postgresql://x/y"
    assert settings.queue.workers == 8 and settings.queue.stale_after == 12.5
    assert settings.queue.effective_heartbeat_interval == 12.5 / 4


@pytest.mark.parametrize(("env", "message"), [
    ({"NEXARCH_QUEUE_WORKERS": "four"}, "NEXARCH_QUEUE_WORKERS='four' is not a whole number"),
    ({"NEXARCH_QUEUE_WORKERS": "0"}, "queue.workers must be a whole number from 1"),
    ({"NEXARCH_QUEUE_STALE_AFTER": "-1"}, "queue.stale_after must be a finite number"),
    ({"NEXARCH_QUEUE_BACKOFF_BASE": "nan"}, "queue.backoff_base"),
    ({"NEXARCH_DATABASE_URL": "mysql://x"}, "must start with postgresql://"),
])
def test_bad_settings_name_the_key(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        Settings.from_env(env)


@pytest.mark.parametrize("interval", [5.0, 4.9, 2.6])
def test_heartbeat_must_beat_at_least_twice_per_stale_timeout(interval: float) -> None:
    with pytest.raises(ConfigurationError, match=r"heartbeat_interval.*at most half"):
        QueueSettings(stale_after=5, heartbeat_interval=interval)
    assert QueueSettings(stale_after=5, heartbeat_interval=2.5).heartbeat_interval == 2.5


def test_database_url_from_a_secret_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    secret = tmp_path / "url"
    secret.write_text("postgresql://u:pw@db/x\n")
    assert Settings.from_env({"NEXARCH_DATABASE_URL_FILE": str(secret)}).database_url \
        == "postgresql://u:pw@db/x"
    with pytest.raises(ConfigurationError, match="cannot be read"):
        Settings.from_env({"NEXARCH_DATABASE_URL_FILE": str(tmp_path / "missing")})


def test_a_misspelt_setting_is_an_error_not_ignored() -> None:
    with pytest.raises(ConfigurationError, match=r"NEXARCH_QUEUE_WORKER\b"):
        Settings.from_env({"NEXARCH_QUEUE_WORKER": "8"})


def test_index_backend_settings() -> None:
    with pytest.raises(ConfigurationError, match="needs manticore_url"):
        Settings.from_env({"NEXARCH_INDEX_BACKEND": "manticore"})
    settings = Settings.from_env({"NEXARCH_INDEX_BACKEND": "manticore",
                                  "NEXARCH_MANTICORE_URL": "http://m:9308",
                                  "NEXARCH_SEARCH_LANGUAGES": "german, simple"})
    assert settings.search_languages == ("german", "simple")
    with pytest.raises(ConfigurationError, match="search_languages"):
        Settings.from_env({"NEXARCH_SEARCH_LANGUAGES": "english;drop"})


@pytest.mark.parametrize(("pool_size", "max_runs", "expected"),
                         [(10, 0, 8), (3, 0, 1), (1, 0, 1), (10, 3, 3), (2, 50, 50)])
def test_runs_at_once_leave_the_pool_room_for_the_rest(pool_size: int, max_runs: int,
                                                       expected: int) -> None:
    from nexarch_events.service import import_settings
    from nexarch_events.settings import ImportSettings, Settings

    settings = Settings(pool_size=pool_size, importer=ImportSettings(max_runs=max_runs))
    assert import_settings(settings).max_runs == expected


@pytest.mark.parametrize("url", [
    "postgresql://alice:HUNTER2pw/xyz@db.example:5432/archive",
    "postgresql://alice:HUNTER2pw#x@db.example:5432/archive",
    "postgresql://alice:HUNTER2pw?x@db.example:5432/archive",
])
def test_a_password_that_breaks_the_url_is_not_quoted_in_the_error(url: str) -> None:
    """urlsplit ends the host part at the "/", "?" or "#" inside the
    password, and the "port" is then the password: it was quoted in the
    error, which goes to the terminal and the logs (a security audit)."""
    with pytest.raises(ConfigurationError) as bad:
        Settings.from_env({"NEXARCH_DATABASE_URL": url})
    assert "HUNTER2pw" not in str(bad.value)
    assert "percent-encode" in str(bad.value)


def test_a_bad_port_is_still_named() -> None:
    with pytest.raises(ConfigurationError, match=r"the port in 'db\.example:54x2' is not a number"):
        Settings.from_env({"NEXARCH_DATABASE_URL": "postgresql://db.example:54x2/archive"})
    # An "@" in the query (a password parameter) is no user part.
    Settings.from_env({"NEXARCH_DATABASE_URL": "postgresql://db.example/archive?password=p@ss"})


def test_the_settings_repr_shows_no_url_password() -> None:
    settings = Settings.from_env({
        "NEXARCH_DATABASE_URL": "postgresql://app:HUNTER2pw@db.example.org/archive",
        "NEXARCH_MANTICORE_URL": "https://search:MANTI-pw@search.example.org:9308"})
    assert "HUNTER2pw" not in repr(settings) and "MANTI-pw" not in repr(settings)
