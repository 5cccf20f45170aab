"""Which database URLs get TLS with verification by default (aio/pg.py
``tls_default``): every server not on this machine, unless the URL (or
PGSSLMODE) says otherwise."""

from __future__ import annotations

import pytest

from nexarch_events.aio.pg import tls_default


@pytest.mark.parametrize("url", [
    "postgresql://app:pw@db.example.org:5432/archive",
    "postgresql://app:pw@10.0.0.5/archive",
    "postgresql://app@[2001:db8::1]:5432/archive",
    "postgresql://app@127.0.0.1:5432,db.example.org:5432/archive",  # one of them is not
    "postgresql://app@/archive?host=db.example.org",
    "postgresql://app@localhost.example.org/archive",
])
def test_a_server_elsewhere_gets_verified_tls(url: str) -> None:
    assert tls_default(url, {}) == {"ssl": True}


@pytest.mark.parametrize("url", [
    "postgresql://postgres@127.0.0.1:5432/postgres",
    "postgresql://postgres@127.0.0.2/postgres",
    "postgresql://postgres@localhost/postgres",
    "postgresql://postgres@[::1]:5432/postgres",
    "postgresql:///postgres?host=/var/run/postgresql",
    "postgresql://postgres@%2Fvar%2Frun%2Fpostgresql/postgres",
    "postgresql:///postgres",
])
def test_this_machine_keeps_the_drivers_default(url: str) -> None:
    assert tls_default(url, {}) == {}


@pytest.mark.parametrize(("url", "env"), [
    ("postgresql://app@db.example.org/archive?sslmode=disable", {}),
    ("postgresql://app@db.example.org/archive?sslmode=require", {}),
    ("postgresql://app@db.example.org/archive", {"PGSSLMODE": "verify-ca"}),
])
def test_an_explicit_sslmode_decides(url: str, env: dict[str, str]) -> None:
    assert tls_default(url, env) == {}


def test_no_host_in_the_url_takes_pghost() -> None:
    assert tls_default("postgresql:///archive", {"PGHOST": "db.example.org"}) == {"ssl": True}
    assert tls_default("postgresql:///archive", {"PGHOST": "/tmp"}) == {}
