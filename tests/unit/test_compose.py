"""compose.yaml stays in step with the package (no container engine runs here)."""

from __future__ import annotations

from pathlib import Path

import yaml

from nexarch_events.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_compose_uses_only_settings_the_package_knows() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "manticore", "worker"} <= set(services)
    env = services["worker"]["environment"]
    assert set(env) <= Settings.known_env_keys()
    # The worker's settings must validate (secret file aside).
    Settings.from_env({k: v for k, v in env.items() if not k.endswith("_FILE")})
    assert env["NEXARCH_MANTICORE_URL"].endswith(":9308")
    assert "127.0.0.1:9308:9308" in services["manticore"]["ports"]
    for name in ("postgres", "manticore"):
        assert "healthcheck" in services[name]
    assert all(s.get("file") for s in compose["secrets"].values())
