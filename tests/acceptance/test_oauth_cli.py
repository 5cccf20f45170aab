"""An OAuth2 mailbox as an operator sets it up: ``nexarch-events mailbox add
--auth oauth2`` with its secrets sealed from stdin, ``mailbox sync-now`` in a
subprocess signing in to a real Dovecot with a token from the local token
endpoint, and nothing secret in the listing or, in clear, in the database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import trio

from nexarch_events.testing.oauth_server import TokenEndpoint
from tests.acceptance.test_cli import cli
from tests.support.dovecot import Dovecot
from tests.support.mailgen import realistic_messages
from tests.support.oauth import CLIENT_ID, CLIENT_SECRET, oauth_dovecot, token_endpoint

REFRESH_TOKEN = "1//refresh-token-of-alice-NOT-FOR-LOGS"


def add_args(dovecot: Dovecot, endpoint: TokenEndpoint, *extra: str) -> list[str]:
    return ["mailbox", "add", "acme", "alice-oauth", "--host", dovecot.host, "--port",
            str(dovecot.port), "--tls", "starttls", "--ca-file", dovecot.ca_file,
            "--user", "alice", "--folder", "Archive", "--auth", "oauth2",
            "--oauth-token-url", endpoint.url, "--oauth-client-id", CLIENT_ID, *extra]


async def run(args: list[str], environ: dict[str, str], stdin: str = ""
              ) -> subprocess.CompletedProcess[str]:
    # In a thread: the token endpoint the subprocess talks to runs on this loop.
    return await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "nexarch_events", *args], env=environ, input=stdin,
        capture_output=True, text=True, timeout=120, check=False))


async def test_an_oauth_mailbox_from_the_command_line(database_url: str,
                                                      tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(cli("mailbox", "new-key", url=None).stdout.strip())
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NEXARCH_")}
    environ.update(NEXARCH_DATABASE_URL=database_url, NEXARCH_SECRET_KEY_FILE=str(key_file))
    async with token_endpoint(refresh_tokens={REFRESH_TOKEN}) as endpoint, \
            oauth_dovecot(endpoint) as dovecot:
        dovecot.create_mailbox("alice", "Archive")
        for raw in realistic_messages(4, seed=15):
            dovecot.append("alice", "Archive", raw)
        added = await run(add_args(dovecot, endpoint, "--oauth-secret-stdin",
                                   "--oauth-refresh-token-stdin"), environ,
                          stdin=f"{CLIENT_SECRET}\n{REFRESH_TOKEN}\n")
        assert added.returncode == 0, added.stderr
        assert "sign-in: oauth2" in added.stdout

        synced = await run(["mailbox", "sync-now", "acme", "alice-oauth"], environ)
        assert synced.returncode == 0, synced.stderr
        assert json.loads(synced.stdout)["imported"] == 4
        # The refresh-token grant, with the secrets that were sealed.
        assert [(r["grant_type"], r["client_secret"], r["refresh_token"])
                for r in endpoint.requests] == [("refresh_token", CLIENT_SECRET, REFRESH_TOKEN)]

        listed = await run(["mailbox", "list", "--json"], environ)
        [mailbox] = json.loads(listed.stdout)
        assert mailbox["auth_method"] == "oauth2" and mailbox["imported_total"] == 4
        shown = listed.stdout + (await run(["mailbox", "list"], environ)).stdout
        for secret in (CLIENT_SECRET, REFRESH_TOKEN, "sealed:"):
            assert secret not in shown
            assert secret not in synced.stderr + added.stderr
        stored = (await trio.run_process(
            ["psql", database_url, "-Atc",
             "SELECT oauth_secret_ref || ' ' || oauth_refresh_ref FROM mail_import_mailboxes"],
            capture_stdout=True)).stdout.decode()
        assert stored.count("sealed:v1:") == 2
        assert CLIENT_SECRET not in stored and REFRESH_TOKEN not in stored

        # A provider that refuses: exit 1 with the provider's reason, no secret.
        endpoint.refuse = "invalid_grant"
        refused = await run(["mailbox", "sync-now", "acme", "alice-oauth"], environ)
        assert refused.returncode == 1
        assert "sign-in refused by the provider" in refused.stderr
        assert "invalid_grant" in refused.stderr and REFRESH_TOKEN not in refused.stderr


async def test_oauth_options_are_checked_before_anything_is_stored(
        database_url: str, dovecot: Dovecot) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NEXARCH_")}
    environ.update(NEXARCH_DATABASE_URL=database_url, APP_SECRET="s")
    endpoint = TokenEndpoint(client_id=CLIENT_ID, client_secret=CLIENT_SECRET,
                             url="http://127.0.0.1:9/token")
    cases = [
        (add_args(dovecot, endpoint), "a client secret"),  # neither secret nor token
        (add_args(dovecot, endpoint, "--oauth-secret-env", "APP_SECRET",
                  "--password-env", "PW"), "not a password"),
        ([a if a != endpoint.url else "http://login.example.org/token"
          for a in add_args(dovecot, endpoint, "--oauth-secret-env", "APP_SECRET")],
         "must be https://"),
        (["mailbox", "add", "acme", "m", "--host", "h", "--user", "u", "--password-env", "PW",
          "--oauth-client-id", "x"], "--oauth-client-id needs --auth oauth2"),
    ]
    for args, message in cases:
        result = await run(args, environ)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr
    listed = await run(["mailbox", "list", "--json"], environ)
    assert json.loads(listed.stdout) == []
