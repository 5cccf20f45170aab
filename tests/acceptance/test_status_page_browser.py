"""The status page in a real browser (Debian's Chromium, driven by
Playwright) against the real API, listener, workers and Postgres.

Playwright's sync API cannot run inside trio (nor next to trio-asyncio's
loop policy), so the browser side runs in a subprocess: this same file,
run as a script. The two talk in JSON lines: the driver reports each step
on stdout, the test answers on stdin once it has imported a message.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

CHROMIUM = "/usr/bin/chromium"


def ensure_chromium() -> str:
    """Debian's Chromium (Playwright never downloads a browser here)."""
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    if os.geteuid() != 0:
        pytest.fail(f"the browser test needs Debian's chromium at {CHROMIUM}: "
                    "run `sudo apt-get install -y chromium`")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "chromium"],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"apt-get installed chromium, but {CHROMIUM} is missing")
    return CHROMIUM


@pytest.fixture(scope="session")
def chromium() -> str:
    if importlib.util.find_spec("playwright") is None:
        pytest.fail("the browser test needs Playwright: pip install -e '.[test]'")
    return ensure_chromium()


class Lines:
    """JSON lines from a trio receive stream."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def next(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise AssertionError(f"the browser driver exited; last output: {self.buffer!r}")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        value = json.loads(line)
        assert isinstance(value, dict)
        if value.get("step") == "error":
            raise AssertionError(f"browser driver failed:\n{value['detail']}")
        return value


@pytest.fixture
async def served(db: Any, database_url: str,
                 fast_settings: Any) -> AsyncIterator[tuple[int, str, Any]]:
    from nexarch_events.api import ApiContext, serve_api
    from nexarch_events.index.postgres import PostgresIndex
    from nexarch_events.mail.indexer import Indexer
    from nexarch_events.metrics import Metrics
    from nexarch_events.queue.notify import JOB_EVENTS_CHANNEL, MAIL_IMPORTED_CHANNEL, Listener
    from nexarch_events.service import QueueService
    from nexarch_events.settings import ApiSettings, ApiToken, Settings

    token = secrets.token_urlsafe(24)
    tokens = (ApiToken("acme-ui", hashlib.sha256(token.encode()).hexdigest(), "acme"),)
    api = ApiSettings(host="127.0.0.1", port=0, tokens=tokens)  # any free port
    settings = Settings(queue=fast_settings, api=api)
    backend = PostgresIndex(db)
    metrics = Metrics()
    listener = Listener(database_url, fast_settings,
                        channels=(MAIL_IMPORTED_CHANNEL, JOB_EVENTS_CHANNEL))
    service = QueueService(db, settings, Indexer(db, backend).handlers())
    service.pool.metrics = metrics
    ctx = ApiContext(db=db, settings=settings, backend=backend, listener=listener,
                     metrics=metrics)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        await nursery.start(service.run)
        port = await nursery.start(serve_api, ctx)
        yield port, token, db
        nursery.cancel_scope.cancel()


def raw_message(word: str, subject: str) -> bytes:
    return (f"From: Carol <carol@example.com>\r\nTo: ops@example.com\r\nSubject: {subject}\r\n"
            "Date: Tue, 04 Mar 2025 09:00:00 +0000\r\n"
            f"Message-ID: <{word}@example.com>\r\n\r\n"
            f"The quarterly {word} numbers are in.\r\n").encode()


#: Rendered as text, this subject is harmless; parsed as HTML it would run.
HOSTILE_SUBJECT = 'Numbers <img src=x onerror="window.__pwned=1"> & <b>more</b>'
HOSTILE_FOLDER = 'Plans <img src=x onerror="window.__pwned=2"> & <b>more</b>'


async def test_status_page_shows_mailboxes_live_events_and_search(
        served: tuple[int, str, Any], chromium: str, tmp_path: Path) -> None:
    from nexarch_events.importer.accounts import (
        AccountConfig,
        AccountRegistry,
        folder_mailbox_name,
    )
    from nexarch_events.importer.folders import Folder
    from nexarch_events.importer.mailboxes import MailboxConfig, MailboxRegistry
    from nexarch_events.importer.state import StateStore

    port, token, db = served
    mailbox_id = await MailboxRegistry(db).add(MailboxConfig(
        "acme", "inbox", "imap.example.com", 993, "implicit", "ops@example.com",
        "env:NEXARCH_TEST_IMAP_PASSWORD"))
    # An account whose folder has a name that would run as HTML.
    accounts = AccountRegistry(db)
    await accounts.add(AccountConfig(
        tenant_slug="acme", name="carol", host="imap.example.com", port=993,
        tls_mode="implicit", username="carol@example.com",
        password_ref="env:NEXARCH_TEST_IMAP_PASSWORD"))
    account = await accounts.get("acme", "carol")
    await accounts.record_folders(account, [Folder("INBOX", "INBOX", "/", frozenset()),
                                            Folder("x", HOSTILE_FOLDER, "/", frozenset())])
    folder_ids = {r["folder"]: r["id"] for r in await MailboxRegistry(db).list("acme")
                  if r["account"] == "carol"}
    states = StateStore(db)
    await states.begin("acme", "inbox", 4242, 2, 1)
    await states.import_message("acme", "inbox", 4242, 1, "new",
                                raw_message("warmup", "Earlier mail"))
    await states.finish("acme", "inbox", error=None, warning=None)

    screenshot = tmp_path / "status-page.png"
    command = [sys.executable, __file__, f"http://127.0.0.1:{port}", token, chromium,
               str(screenshot)]
    with trio.fail_after(180):
        async with trio.open_nursery() as nursery:
            driver: trio.Process = await nursery.start(partial(
                trio.run_process, command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                check=False))
            assert driver.stdout is not None and driver.stdin is not None
            lines = Lines(driver.stdout)
            shown = await lines.next()
            assert shown["step"] == "mailboxes"
            assert {"id": str(mailbox_id), "name": "inbox"} in shown["rows"]
            assert len(shown["rows"]) == 3  # inbox and the account's two folders
            assert shown["url_has_token"] is False
            listed = await lines.next()
            assert listed["step"] == "accounts"
            assert listed["accounts"] == [{"id": str(account.id), "name": "carol"}]
            assert sorted(map(tuple, listed["folders"])) == sorted(
                (str(i), name) for name, i in folder_ids.items())
            assert listed["posted"] == [
                [f"/accounts/{account.id}/sync", 202],
                [f"/mailboxes/{folder_ids['INBOX']}/sync", 202]]
            requested = {r["name"]: r["sync_requested_at"] is not None
                         for r in await MailboxRegistry(db).list("acme")}
            # The account's button asked for both folders, the folder's for one.
            assert requested == {"inbox": False, "carol/INBOX": True,
                                 folder_mailbox_name("carol", HOSTILE_FOLDER): True}
            assert (await lines.next())["step"] == "live"

            word = f"kingfisher{secrets.randbelow(10**6)}"
            await states.begin("acme", "inbox", 4242, 3, 2)
            stored = await states.import_message("acme", "inbox", 4242, 2, "new",
                                                 raw_message(word, HOSTILE_SUBJECT))
            await states.finish("acme", "inbox", error=None, warning=None)
            order = {"archive_id": stored.archive_id, "job_id": stored.job_id, "word": word}
            await driver.stdin.send_all(json.dumps(order).encode() + b"\n")

            assert (await lines.next())["step"] == "imported"
            assert (await lines.next())["step"] == "indexed"
            found = await lines.next()
            assert found["step"] == "found"
            assert found["subject"] == HOSTILE_SUBJECT
            assert found["marked"] == [word]
            assert found["pwned"] is False
            assert found["injected_elements"] == 0
            done = await lines.next()
            assert done["step"] == "done"
            assert await driver.wait() == 0
    assert screenshot.stat().st_size > 0


# -- the browser side (a subprocess: ``python this_file URL TOKEN CHROMIUM PNG``) ----------

def drive(base: str, token: str, chromium: str, screenshot: str) -> None:
    from playwright.sync_api import sync_playwright

    def say(step: str, **data: Any) -> None:
        print(json.dumps({"step": step, **data}), flush=True)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        page.set_default_timeout(30_000)
        page.goto(f"{base}/#token={token}")
        page.wait_for_selector("#mailbox-rows tr[data-mailbox-id]")
        rows = page.eval_on_selector_all(
            "#mailbox-rows tr", "rows => rows.map(r => ({id: r.dataset.mailboxId, "
            "name: r.querySelector('.mailbox-name').textContent}))")
        say("mailboxes", rows=rows, url_has_token="token" in page.url)
        page.wait_for_selector("#account-rows tr.folder")
        accounts = page.eval_on_selector_all(
            "#account-rows tr.account", "rows => rows.map(r => ({id: r.dataset.accountId, "
            "name: r.querySelector('.account-name').textContent}))")
        folders = page.eval_on_selector_all(
            "#account-rows tr.folder", "rows => rows.map(r => [r.dataset.mailboxId, "
            "r.querySelector('.folder-name').textContent])")
        # "Sync now" of the account, then of its first folder (INBOX).
        posted = []
        for row in ("#account-rows tr.account", "#account-rows tr.folder"):
            with page.expect_response(lambda r: r.url.split("?")[0].endswith("/sync")) as sent:
                page.click(f"{row} button")
            response = sent.value
            posted.append(["/" + response.url.split("?")[0].split("/", 3)[3], response.status])
        say("accounts", accounts=accounts, folders=folders, posted=posted)
        page.wait_for_selector('#stream-state[data-state="live"]')
        page.wait_for_selector('#events li[data-kind="open"]', state="attached")
        say("live")

        order = json.loads(sys.stdin.readline())
        page.wait_for_selector(
            f'#events li[data-kind="imported"][data-archive-id="{order["archive_id"]}"]',
            state="attached")
        say("imported")
        page.wait_for_function(
            "jobId => [...document.querySelectorAll('#events li[data-kind=indexed]')]"
            ".some(li => li.textContent.includes(String(jobId)))", arg=order["job_id"])
        say("indexed")

        page.fill("#q", order["word"])
        page.click("#search-form button")
        hit = page.wait_for_selector(f'#hits li[data-archive-id="{order["archive_id"]}"]')
        assert hit is not None
        say("found",
            subject=hit.eval_on_selector(".hit-subject", "e => e.textContent"),
            marked=hit.eval_on_selector_all("mark", "ms => ms.map(m => m.textContent)"),
            pwned=page.evaluate("() => window.__pwned === 1"),
            injected_elements=page.evaluate(
                "() => document.querySelectorAll('#hits img, #hits b, #events img, "
                "#account-rows img, #account-rows b, #mailbox-rows img').length"))
        page.wait_for_function("() => document.getElementById('q-succeeded').textContent !== '–'")
        page.screenshot(path=screenshot, full_page=True)
        browser.close()
    say("done")


if __name__ == "__main__":
    try:
        drive(*sys.argv[1:5])
    except BaseException:
        import traceback

        print(json.dumps({"step": "error", "detail": traceback.format_exc()}), flush=True)
        sys.exit(1)
