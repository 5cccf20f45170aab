"""The TOML configuration file, environment overrides and `config check`."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from nexarch_events.config import effective, load_settings, mask_url
from nexarch_events.errors import ConfigurationError

TOKEN = "0123456789abcdef-ops-token"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "nexarch.toml"
    path.write_text(text)
    return str(path)


def test_file_then_environment(tmp_path: Path) -> None:
    token_file = tmp_path / "acme.token"
    token_file.write_text("acme-token-0123456789\n")
    path = write(tmp_path, f'''
database_url = "postgresql://app:s3cret@db/mail"
search_languages = ["english"]
log_format = "json"
[queue]
workers = 8
[import]
idle_limit = 3
[api]
port = 9090
[[api.tokens]]
name = "ops"
token = "{TOKEN}"
[[api.tokens]]
name = "acme"
tenant = "acme"
token_file = "{token_file}"
''')
    settings = load_settings(path, {"NEXARCH_QUEUE_WORKERS": "2"})
    assert settings.queue.workers == 2  # the environment wins
    assert settings.importer.idle_limit == 3 and settings.api.port == 9090
    assert settings.search_languages == ("english",) and settings.log_format == "json"
    ops, acme = settings.api.tokens
    assert ops.tenant is None and ops.sha256 == hashlib.sha256(TOKEN.encode()).hexdigest()
    assert acme.tenant == "acme"
    shown = json.dumps(effective(settings))
    assert "s3cret" not in shown and TOKEN not in shown and ops.sha256 not in shown


@pytest.mark.parametrize(("text", "message"), [
    ("worker = 3", "unknown key 'worker'"),
    ("[queue]\nworkerz = 3", "unknown key queue.workerz"),
    ("[queue]\nworkers = 0", "queue.workers must be a whole number"),
    ("[api]\nport = 99999", "api.port"),
    ("[[api.tokens]]\nname = \"x\"", "exactly one of token"),
    ("[[api.tokens]]\nname = \"x\"\ntoken = \"short\"", "at least 16"),
    ("[[api.tokens]]\nname = \"x\"\ntenant = \"Bad Slug\"\ntoken_sha256 = \"" + "a" * 64 + "\"",
     "not a valid tenant slug"),
    ("log_format = \"xml\"", "log_format must be"),
    ("this is = not toml", "not valid TOML"),
])
def test_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_settings(write(tmp_path, text), {})


def test_missing_file_and_env_pointer(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot be read"):
        load_settings(str(tmp_path / "nope.toml"), {})
    path = write(tmp_path, "[queue]\nworkers = 5")
    assert load_settings(None, {"NEXARCH_CONFIG": path}).queue.workers == 5


def test_mask_url() -> None:
    assert mask_url("postgresql://u:p%40ss@h:5/d") == "postgresql://u:***@h:5/d"
    assert mask_url("postgresql://h/d") == "postgresql://h/d"
    assert mask_url("postgresql://u@h/d?password=hunter2&sslmode=require") == \
        "postgresql://u@h/d?password=***&sslmode=require"
    assert mask_url("postgresql://u:a@h/d?sslpassword=b&PASSWORD=c") == \
        "postgresql://u:***@h/d?sslpassword=***&PASSWORD=***"


def test_config_check_command(tmp_path: Path) -> None:
    path = write(tmp_path, 'database_url = "postgresql://u:hunter2hunter2@h/d"\n')
    env = {"PATH": "/usr/bin:/bin"}
    ok = subprocess.run([sys.executable, "-m", "nexarch_events", "--config", path, "config",
                         "check"], env=env, capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["database_url"] == "postgresql://u:***@h/d"
    assert "hunter2" not in ok.stdout + ok.stderr
    bad = subprocess.run([sys.executable, "-m", "nexarch_events", "--config", path, "config",
                          "check"], env={**env, "NEXARCH_POOL_SIZE": "x"},
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "NEXARCH_POOL_SIZE='x' is not a whole number" in bad.stderr


def test_secrets_readable_by_every_user_are_warned_of(tmp_path: Path) -> None:
    """Like ssh with a key file: the command still runs, and says what to fix."""
    key = tmp_path / "secret.key"
    key.write_text(Fernet.generate_key().decode())
    inline = write(tmp_path, '[[api.tokens]]\nname = "ops"\ntoken = "0123456789abcdef-token"\n')
    env = {"PATH": "/usr/bin:/bin", "NEXARCH_SECRET_KEY_FILE": str(key)}

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "nexarch_events", "--config", inline,
                               "config", "check"], env=env, capture_output=True, text=True,
                              check=False)

    os.chmod(key, 0o644)
    os.chmod(inline, 0o644)
    loose = check()
    assert loose.returncode == 0, loose.stderr
    assert f"{key} holds a secret (NEXARCH_SECRET_KEY_FILE)" in loose.stderr
    assert f"{inline} holds an API token in clear text" in loose.stderr
    assert "0123456789abcdef" not in loose.stderr + loose.stdout
    os.chmod(key, 0o600)
    os.chmod(inline, 0o640)
    tight = check()
    assert tight.returncode == 0 and "holds" not in tight.stderr, tight.stderr


@pytest.mark.parametrize("url", [
    "http://indexer:hunter2#x@manticore:9308", "http://indexer:hun/ter2@manticore:9308",
    "http://indexer:s3cr?et@manticore:9308", "postgresql://u:p@ss@h:5/d",
    "postgresql://u:hunter2@h:5/d?password=hunter2"])
def test_mask_url_hides_a_password_with_unencoded_delimiters(url: str) -> None:
    # Found by an audit: urlsplit ends the netloc at "#", "/" or "?", so the
    # password was not recognised and `config` printed it in clear.
    masked = mask_url(url)
    assert masked is not None and "hunter2" not in masked and "hun/ter2" not in masked
    assert "s3cr?et" not in masked and "p@ss" not in masked and ":***@" in masked


def test_file_problems_are_configuration_errors_that_say_what(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """From an operator audit: a file that is not UTF-8 (exit 70), a section
    given as a value ("unknown key 'api'", which it is not), and a NUL in a
    path (exit 70)."""
    import pytest as _pytest

    from nexarch_events.config import load_settings
    from nexarch_events.errors import ConfigurationError

    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('data_dir = "Grüße"\n'.encode("latin-1"))
    with _pytest.raises(ConfigurationError, match="not valid TOML"):
        load_settings(str(latin1), environ={})
    section = tmp_path / "section.toml"
    section.write_text("api = 5\n")
    with _pytest.raises(ConfigurationError, match=r"api must be a table \(\[api\]\)"):
        load_settings(str(section), environ={})
    nul = tmp_path / "nul.toml"
    nul.write_text('data_dir = "a\\u0000b"\n')
    with _pytest.raises(ConfigurationError, match="contains a NUL"):
        load_settings(str(nul), environ={})


def run_cli(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nexarch_events", *argv],
                          env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True,
                          check=False)


def test_the_log_level_is_taken_from_the_file_the_environment_and_the_flag(
        tmp_path: Path) -> None:
    """The file's log_level was accepted and ignored, and a misspelt level
    was taken as info (an operator audit): a service that was meant to log
    quietly, or in detail, did neither, and nothing said why."""
    path = write(tmp_path, 'log_level = "warning"\n')
    assert load_settings(path, environ={}).log_level == "warning"
    assert load_settings(path, environ={"NEXARCH_LOG_LEVEL": "DEBUG"}).log_level == "debug"
    shown = run_cli("--config", path, "config", "check", env={})
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["log_level"] == "warning"

    # What the level does: the warning about a world-readable token file,
    # logged while the file is read, is held until the level is known.
    token_file = tmp_path / "ops.token"
    token_file.write_text("0123456789abcdef-token")
    os.chmod(token_file, 0o644)
    with_token = write(tmp_path, f'log_level = "error"\n[[api.tokens]]\nname = "ops"\n'
                                 f'token_file = "{token_file}"\n')
    quiet = run_cli("--config", with_token, "config", "check", env={})
    assert quiet.returncode == 0 and "holds an API token" not in quiet.stderr
    assert "holds an API token" in run_cli("--log-level", "info", "--config", with_token,
                                           "config", "check", env={}).stderr
    as_json = run_cli("--config", with_token, "config", "check",
                      env={"NEXARCH_LOG_LEVEL": "warning", "NEXARCH_LOG_FORMAT": "json"})
    assert json.loads(as_json.stderr.splitlines()[0])["level"] == "WARNING"

    bogus_flag = run_cli("--log-level", "verbose", "config", "check", env={})
    assert bogus_flag.returncode == 2 and "verbose" in bogus_flag.stderr
    bogus_env = run_cli("config", "check", env={"NEXARCH_LOG_LEVEL": "loud"})
    assert bogus_env.returncode == 2
    assert "log_level must be one of debug, info, warning, error, got 'loud'" in bogus_env.stderr
    bogus_file = run_cli("--config", write(tmp_path, "log_level = 3\n"), "config", "check",
                         env={})
    assert bogus_file.returncode == 2 and "'3'" in bogus_file.stderr


def test_a_secret_key_that_cannot_seal_is_refused_at_start(tmp_path: Path) -> None:
    """A garbage key passed `config check` and failed only when a password
    was first sealed or opened (an operator audit)."""
    key = tmp_path / "secret.key"
    key.write_text("not-a-key-at-all")
    os.chmod(key, 0o600)
    bad = run_cli("config", "check", env={"NEXARCH_SECRET_KEY_FILE": str(key)})
    assert bad.returncode == 2
    assert "NEXARCH_SECRET_KEY_FILE does not hold a valid key" in bad.stderr
    assert "not-a-key-at-all" not in bad.stderr
    key.write_text(Fernet.generate_key().decode())
    good = run_cli("config", "check", env={"NEXARCH_SECRET_KEY_FILE": str(key)})
    assert good.returncode == 0, good.stderr
