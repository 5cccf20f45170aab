"""``/events`` across a reconnect of the API's LISTEN connection, with the
reconnect held at chosen points on the wire (tests/support/tcp_proxy.py):
the listener's connection is killed for real (pg_terminate_backend), its new
connection is held before each LISTEN, mail is archived while nothing
listens, and one message right after the first channel listens again, so
its notification arrives before the listener announces the reconnect."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

import trio

from nexarch_events.aio import Database
from nexarch_events.queue.notify import MAIL_IMPORTED_CHANNEL, Notification
from nexarch_events.settings import QueueSettings
from tests.integration.test_api import (
    Sse,
    imported_ids,
    job_ids,
    message,
    open_env,
    open_events,
    retry_until_failed_again,
)
from tests.support.tcp_proxy import TcpProxy


async def test_a_live_event_that_beats_the_resync_does_not_skip_the_replay(
        db: Database, database_url: str, fast_settings: QueueSettings) -> None:
    proxy = TcpProxy.for_url(database_url)
    # The listener's statements time out after twice this: longer than the
    # test holds its LISTENs.
    settings = replace(fast_settings, listener_ping_timeout=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        async with open_env(db, database_url, settings,
                            listen_url=proxy.url(database_url)) as env, \
                open_events(env, env.tokens.acme) as events:
            listener = env.ctx.listener
            assert (await events.next()).event == "open"
            received: list[Sse] = []

            async def read() -> None:
                while True:
                    received.append(await events.next(within=3600))

            async def wait_for(done: Callable[[], bool]) -> None:
                with trio.fail_after(30):
                    while not done():
                        await trio.sleep(0.02)

            async with trio.open_nursery() as reading:
                reading.start_soon(read)
                [before] = await env.import_mail("acme", "inbox", [message("pre-kill")])
                await wait_for(lambda: before.job_id in job_ids(received))
                del received[:]

                first_listen = proxy.gate(b'LISTEN "nexarch_mail_imported"')
                second_listen = proxy.gate(b'LISTEN "nexarch_job_events"')
                old_pid = listener.backend_pid
                assert await db.fetchval("SELECT pg_terminate_backend($1)", old_pid)
                with trio.fail_after(30):
                    # Reconnected (and self-checked), its first LISTEN held: nothing
                    # is listened to now, so these are never notified to the stream.
                    await first_listen.reached.wait()
                assert not listener.connected
                during = await env.import_mail("acme", "inbox",
                                               [message(f"while-down{n}") for n in range(3)])
                await env.wait_finished([s.job_id for s in during])

                first_listen.open()
                with trio.fail_after(30):
                    # The mail-imported channel listens again; the listener has not
                    # announced the reconnect (RESYNC) yet.
                    await second_listen.reached.wait()
                watch = listener.subscribe(MAIL_IMPORTED_CHANNEL)
                try:
                    [after] = await env.import_mail("acme", "inbox", [message("right-after")])
                    with trio.fail_after(30):
                        while True:
                            note = await watch.receive()
                            if isinstance(note, Notification) \
                                    and note.json().get("archive_id") == after.archive_id:
                                break
                finally:
                    listener.unsubscribe(watch)
                assert not listener.connected
                # Give the stream time to act on that notification before the
                # reconnect is announced (before the fix it sent it at once, and
                # its id moved the replay's starting point past the missed ones).
                await trio.sleep(1.0)
                second_listen.open()

                expected_archive = [s.archive_id for s in during] + [after.archive_id]
                expected_jobs = {s.job_id for s in during} | {after.job_id}
                with trio.move_on_after(30):
                    await wait_for(lambda: set(expected_archive) <= set(imported_ids(received))
                                   and expected_jobs <= set(job_ids(received)))
                await trio.sleep(1.0)  # anything sent twice would come now
                assert listener.backend_pid not in (None, old_pid)

                kinds = [e.event for e in received]
                assert "resync" in kinds, kinds
                # Every message once, in id order, the replayed ones before the
                # live one that overtook the reconnect's announcement.
                assert imported_ids(received) == expected_archive, [
                    (e.event, e.data.get("archive_id"), e.data.get("replayed")) for e in received]
                assert sorted(job_ids(received)) == sorted(expected_jobs)
                assert kinds.index("resync") < kinds.index("imported")
                marks = [int(e.id.split(".")[0]) for e in received if e.id]
                assert marks == sorted(marks) and marks[-1] == after.archive_id
                reading.cancel_scope.cancel()
        nursery.cancel_scope.cancel()


async def test_a_job_retried_while_the_listener_is_down_is_announced_on_a_fresh_stream(
        db: Database, database_url: str, fast_settings: QueueSettings) -> None:
    """A stream opened without Last-Event-ID never asked whether its
    watermark job was re-queued, also in the replay after a reconnect: a
    failed job retried (and failed again) while the listener was down moved
    past the watermark and was never announced (found by an audit). Now
    the replay says what became of it, or that it cannot tell (resync)."""
    proxy = TcpProxy.for_url(database_url)
    settings = replace(fast_settings, listener_ping_timeout=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        async with open_env(db, database_url, settings,
                            listen_url=proxy.url(database_url)) as env, \
                open_events(env, env.tokens.acme) as events:
            listener = env.ctx.listener
            assert (await events.next()).event == "open"
            failed = await env.failed_job("acme")
            seen = await events.until(lambda e: e.event == "failed" and failed in e.data["ids"])
            assert seen[-1].id is not None and seen[-1].id.endswith(f".{failed}")

            first_listen = proxy.gate(b'LISTEN "nexarch_mail_imported"')
            old_pid = listener.backend_pid
            assert await db.fetchval("SELECT pg_terminate_backend($1)", old_pid)
            with trio.fail_after(30):
                await first_listen.reached.wait()
            assert not listener.connected
            # Retried and failed again while nothing listens: never notified.
            await retry_until_failed_again(env, failed)
            first_listen.open()
            # What became of it is told in the replay after the reconnect
            # (its outcome, or a resync saying it cannot be told). Waited
            # for before the next import: a resync covers what finished
            # before it, and on a loaded machine the replay can come late.
            told = await events.until(
                lambda e: (e.event == "failed" and failed in e.data["ids"])
                or (e.event == "resync" and e.data.get("replayed") is True))
            [after] = await env.import_mail("acme", "inbox", [message("after-retry")])
            got = await events.until(lambda e: e.event == "indexed"
                                     and after.job_id in e.data["ids"])
        nursery.cancel_scope.cancel()
    assert told[-1].data.get("replayed") is True, [(e.event, e.id, e.data) for e in told]
    assert after.archive_id in imported_ids(got)
    assert job_ids(got) == [after.job_id]


async def test_a_resync_for_a_pruned_history_is_not_repeated_on_every_reconnect(
        db: Database, database_url: str, fast_settings: QueueSettings) -> None:
    """A fresh stream of a tenant with no finished job stays "after job 0";
    once anything was ever pruned, each reconnect's replay said "resync"
    and skipped the replay, for ever: mail archived during the second
    outage was never announced (a review). Told once, it replays."""
    proxy = TcpProxy.for_url(database_url)
    settings = replace(fast_settings, listener_ping_timeout=30.0)
    await db.execute("UPDATE mail_index_jobs_pruned SET max_id = 1, max_finished_at = now(), "
                     "max_finished_id = 1")
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        async with open_env(db, database_url, settings,
                            listen_url=proxy.url(database_url)) as env, \
                open_events(env, env.tokens.globex) as events:
            listener = env.ctx.listener
            assert (await events.next()).event == "open"

            async def outage(during: Callable[[], Awaitable[None]] | None = None) -> None:
                listen = proxy.gate(b'LISTEN "nexarch_mail_imported"')
                assert await db.fetchval("SELECT pg_terminate_backend($1)",
                                         listener.backend_pid)
                with trio.fail_after(30):
                    await listen.reached.wait()
                if during is not None:
                    await during()
                listen.open()
                with trio.fail_after(30):
                    while not listener.connected:
                        await trio.sleep(0.02)

            await outage()
            first = await events.until(lambda e: e.event == "resync"
                                       and e.data.get("replayed") is True)
            archived: list[int] = []

            async def archive() -> None:
                [stored] = await env.import_mail("globex", "inbox", [message("in-outage")])
                archived.append(stored.archive_id)

            await outage(archive)
            got = await events.until(lambda e: archived and archived[0] in imported_ids([e]))
        nursery.cancel_scope.cancel()
    assert first[-1].event == "resync"
    assert not [e for e in got if e.event == "resync" and e.data.get("replayed") is True], \
        [(e.event, e.data) for e in got]
