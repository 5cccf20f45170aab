"""compose.yaml stays in step with the package (no container engine runs here)."""

from __future__ import annotations

from pathlib import Path

import yaml

from nexarch_events.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_compose_uses_only_settings_the_package_knows() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "manticore", "service", "dovecot"} <= set(services)
    env = services["service"]["environment"]
    assert set(env) <= Settings.known_env_keys()
    # The worker's settings must validate (secret file aside).
    Settings.from_env({k: v for k, v in env.items() if not k.endswith(("_FILE", "CONFIG"))})
    assert env["NEXARCH_MANTICORE_URL"].endswith(":9308")
    assert "127.0.0.1:9308:9308" in services["manticore"]["ports"]
    for name in ("postgres", "manticore", "service", "dovecot"):
        assert "healthcheck" in services[name]
    # The API listens where the port mapping and the health check look.
    settings = Settings.from_env({k: v for k, v in env.items() if not k.endswith(("_FILE",
                                                                                 "CONFIG"))})
    assert settings.index_backend == "manticore"
    assert settings.api.host == "0.0.0.0"
    assert f"127.0.0.1:{settings.api.port}:{settings.api.port}" in services["service"]["ports"]
    assert f":{settings.api.port}/readyz" in " ".join(services["service"]["healthcheck"]["test"])
    assert services["service"]["command"] == ["nexarch-events", "run"]
    assert set(services["service"]["secrets"]) <= set(compose["secrets"])
    assert all(s.get("file") for s in compose["secrets"].values())


def test_compose_runs_postgres_without_jit() -> None:
    # README, "Production": a misestimated plan JIT-compiled for 200-300 ms.
    postgres = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["postgres"]
    command = postgres["command"]
    assert command[0] == "postgres"
    assert [command[i + 1] for i, arg in enumerate(command) if arg == "-c"] == ["jit=off"]


def test_every_path_the_compose_examples_name_is_mounted() -> None:
    """The examples named /run/secrets/imap_alice and /data, which nothing
    mounted, and a password variable the service never had (a deployment
    audit)."""
    import re

    text = (ROOT / "compose.yaml").read_text()
    services = yaml.safe_load(text)["services"]
    mounts = [f"/run/secrets/{name}" for name in services["postgres"]["secrets"]]
    mounts += [v.split(":")[1] for v in services["service"].get("volumes", [])]
    mounts += [f"/run/secrets/{name}" for name in services["service"]["secrets"]]
    named = set(re.findall(r"(/(?:run/secrets|data)/[\w./-]*)", text))
    assert "/data/" in named and "/run/secrets/imap/alice" in named
    for path in named:
        assert any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts), path
    assert "--password-env" not in text  # the running service, not the CLI, reads it


def test_the_image_runs_as_a_fixed_uid() -> None:
    # Compose mounts secrets with the host file's owner and mode: an uid
    # that useradd picks cannot be given them without world-read.
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--uid 10001" in dockerfile and "\nUSER 10001\n" in dockerfile
    assert "chown -R 10001" in (ROOT / "compose.yaml").read_text()
