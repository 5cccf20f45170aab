"""A job that kills its worker fails alone (guarantee 12).

A worker process claims a batch of 100 jobs; one of them SIGKILLs the
process. Whatever process comes next (the test starts one whenever none is
alive) must finish the 99 others without charging them an attempt, and end
the poison job `failed`, with an error that says it is the suspect.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from nexarch_events.aio import Connection, Database
from nexarch_events.models import JobId, JobStatus, JobType, NewJob
from nexarch_events.queue.jobs import Queue
from nexarch_events.queue.worker import WorkerPool
from nexarch_events.settings import QueueSettings
from tests.support.handlers import read_effects
from tests.support.procs import WorkerProcess, WorkerProcesses, job_rows

SETTINGS: dict[str, float | int] = {
    "stale_after": 2.0, "heartbeat_interval": 0.25, "backoff_base": 0.2, "backoff_cap": 3,
    "drain_interval": 60.0, "shutdown_grace": 2.0, "listener_ping_interval": 1.0,
    "listener_ping_timeout": 2.0, "reconnect_min": 0.05, "reconnect_max": 0.5,
}
MAX_ATTEMPTS = 3


@pytest.mark.slow
async def test_a_job_that_kills_its_worker_fails_alone(
        db: Database, database_url: str, tmp_path: Path) -> None:
    poison_at = 37
    jobs = [NewJob(JobType.INDEX, "acme", f"batch-{n}", {"kill": True} if n == poison_at else {},
                   max_attempts=MAX_ATTEMPTS) for n in range(100)]
    ids = [int(i) for i in await Queue(db).enqueue_many(jobs)]
    poison = ids[poison_at]
    async with WorkerProcesses(database_url, tmp_path / "effects.tsv", tmp_path,
                               SETTINGS) as procs:
        current: WorkerProcess | None = None
        with trio.fail_after(150):
            while True:
                rows = await job_rows(db, ids)
                if all(r["status"] in ("succeeded", "failed") for r in rows.values()):
                    break
                if current is None or current.returncode is not None:
                    # One worker task claiming up to 100: the first claim
                    # takes the whole batch, poison included.
                    current = await procs.start(f"p{len(procs.started)}", workers=1,
                                                batch_size=100)
                await trio.sleep(0.2)
        deaths = sum(1 for p in procs.started if p.returncode is not None)

    rows = await job_rows(db, ids)
    assert {i: r["status"] for i, r in rows.items() if r["status"] != "succeeded"} == \
        {poison: "failed"}
    # Only the culprit was charged: each of the others ran once alone after
    # the batch died, on its first counted attempt.
    assert {r["attempts"] for i, r in rows.items() if i != poison} == {1}
    assert rows[poison]["attempts"] == MAX_ATTEMPTS
    assert "suspected of killing its worker" in rows[poison]["last_error"]
    assert "alone" in rows[poison]["last_error"]
    # The batch's death, then one death per counted attempt of the poison job.
    assert deaths == 1 + MAX_ATTEMPTS
    starts = [e for e in read_effects(tmp_path / "effects.tsv") if e.job_id == poison]
    assert len(starts) == 1 + MAX_ATTEMPTS


@pytest.mark.slow
async def test_a_poison_job_fails_alone_with_four_worker_tasks_per_process(
        db: Database, database_url: str, tmp_path: Path) -> None:
    """"Alone" was per worker task: with the default 4 tasks per process,
    the other tasks ran their isolated jobs beside the poison, died with it,
    and were charged as suspects until 3 of 19 innocent jobs had failed (a
    queue audit). Now an isolated job runs only in a process that runs
    nothing else, and a job is charged only if its process ran nothing else."""
    jobs = [NewJob(JobType.INDEX, "acme", f"task-{n}",
                   {"kill": True} if n == 0 else {"sleep": 0.2}, max_attempts=MAX_ATTEMPTS)
            for n in range(20)]
    ids = [int(i) for i in await Queue(db).enqueue_many(jobs)]
    poison = ids[0]
    async with WorkerProcesses(database_url, tmp_path / "effects.tsv", tmp_path,
                               SETTINGS) as procs:
        current: WorkerProcess | None = None
        with trio.fail_after(150):
            while True:
                rows = await job_rows(db, ids)
                if all(r["status"] in ("succeeded", "failed") for r in rows.values()):
                    break
                if current is None or current.returncode is not None:
                    current = await procs.start(f"q{len(procs.started)}", workers=4,
                                                batch_size=5)
                await trio.sleep(0.2)
    rows = await job_rows(db, ids)
    assert {i: r["status"] for i, r in rows.items() if r["status"] != "succeeded"} == \
        {poison: "failed"}
    assert {r["attempts"] for i, r in rows.items() if i != poison} == {1}
    assert rows[poison]["attempts"] == MAX_ATTEMPTS


async def test_two_sweepers_at_once_never_charge_part_of_a_batch(db: Database) -> None:
    """Each sweeper counted only the rows it could lock: two at once split a
    dead batch, and a sweeper that got one row charged it as alone (a queue
    audit: 1-2 of 200 trials; on a last attempt, failed)."""
    settings = QueueSettings(stale_after=0.3, heartbeat_interval=0.1)
    queue = Queue(db, settings)
    ids = [int(i) for i in await queue.enqueue_many(
        [NewJob(JobType.INDEX, "acme", f"s{n}", {}, max_attempts=1) for n in range(2)])]
    assert len(await queue.claim(10, "dead/0")) == 2
    await trio.sleep(0.5)
    holder = await Connection.open(db.dsn)
    try:
        # Another sweeper holds one of the two rows (its statement in flight).
        await holder.execute("BEGIN")
        await holder.execute("SELECT 1 FROM mail_index_jobs WHERE id = $1 FOR UPDATE", ids[0])
        reclaimed = await queue.reclaim_stale_jobs()
        await holder.execute("ROLLBACK")
    finally:
        await holder.aclose()
    assert [(r.id, r.status, r.alone) for r in reclaimed] == [(ids[1], JobStatus.PENDING, False)]


async def test_while_an_isolated_job_runs_its_process_claims_nothing_else(
        db: Database) -> None:
    """Other tasks of the process claimed normal jobs beside a running
    isolated one; the poison's death then counted them and was refunded,
    and they were isolated too (a review: 11 deaths instead of 5, 71
    innocent jobs killed). Other processes go on."""
    queue = Queue(db)
    [suspect] = await queue.enqueue_many([NewJob(JobType.INDEX, "acme", "suspect", {})])
    await db.execute("UPDATE mail_index_jobs SET isolate = true WHERE id = $1", suspect)
    others = [int(i) for i in await queue.enqueue_many(
        [NewJob(JobType.INDEX, "acme", f"n{n}", {}) for n in range(5)])]
    assert [j.id for j in await queue.claim(10, "host:1/0")] == [suspect]
    assert await queue.claim(10, "host:1/1") == []
    assert sorted(j.id for j in await queue.claim(10, "host:2/0")) == others


async def test_two_tasks_claiming_at_once_never_run_an_isolated_job_beside_others(
        db: Database) -> None:
    """Task 0 takes the isolated job; task 1 skipped its locked row, found
    no isolated job ready once task 0 had committed, and took normal jobs
    on a path that never looked whether its process runs one (a review: 38
    of 2000 trials). Many trials, as the window is narrow."""
    queue = Queue(db)
    tasks = [await Connection.open(db.dsn) for _ in range(2)]
    beside = 0
    try:
        for _ in range(400):
            await db.execute("DELETE FROM mail_index_jobs")
            ids = [int(i) for i in await queue.enqueue_many(
                [NewJob(JobType.INDEX, "acme", f"m{n}", {}) for n in range(6)])]
            await db.execute("UPDATE mail_index_jobs SET isolate = true WHERE id = $1", ids[0])
            async with trio.open_nursery() as nursery:
                for n, conn in enumerate(tasks):
                    nursery.start_soon(Queue(conn).claim, 10, f"p:1#x/{n}")
            running = await db.fetch("SELECT isolate FROM mail_index_jobs "
                                     "WHERE status = 'processing'")
            if any(r["isolate"] for r in running) and len(running) > 1:
                beside += 1
    finally:
        for conn in tasks:
            await conn.aclose()
    assert beside == 0


async def test_a_restart_under_the_same_name_does_not_shield_the_dead_process_job(
        db: Database) -> None:
    """A container restarted as the same "hostname:1" had a live job the
    sweeper counted as the dead process's: the suspect ran "with another
    job" and was refunded instead of failed (a review). Each start draws
    its own process identity, so the two are apart."""
    async def noop(jobs: object) -> dict[int, object]:
        return {}

    queue = Queue(db, QueueSettings(stale_after=0.3, heartbeat_interval=0.1))
    first, second = (WorkerPool(queue, {"index": noop, "delete": noop},  # type: ignore[dict-item]
                                name="box:1") for _ in range(2))
    assert first.name == second.name == "box:1"
    assert first.instance != second.instance
    [dead] = await queue.enqueue_many([NewJob(JobType.INDEX, "acme", "d", {}, max_attempts=1)])
    assert [j.id for j in await queue.claim(10, f"{first.instance}/0")] == [dead]
    await trio.sleep(0.5)
    [live] = await queue.enqueue_many([NewJob(JobType.INDEX, "acme", "l", {})])
    assert [j.id for j in await queue.claim(10, f"{second.instance}/0")] == [live]
    assert await queue.reclaim_stale() == {dead: JobStatus.FAILED}


async def test_a_dead_process_is_judged_once_all_its_jobs_are_stale(db: Database) -> None:
    """Two jobs of one process go stale seconds apart (one was claimed after
    the process's last heartbeat): the sweeper judged each in turn "alone"
    and charged both (a review). Now it waits for the last, and the two,
    having died together, are refunded and isolated."""
    queue = Queue(db, QueueSettings(stale_after=30.0))
    ids = [int(i) for i in await queue.enqueue_many(
        [NewJob(JobType.INDEX, "acme", f"p{n}", {}, max_attempts=1) for n in range(2)])]
    assert [j.id for j in await queue.claim(1, "host:7#a/0")] == ids[:1]
    assert [j.id for j in await queue.claim(1, "host:7#a/1")] == ids[1:]
    age = "UPDATE mail_index_jobs SET heartbeat_at = now() - $2::float8 * interval '1 s' " \
          "WHERE id = $1"
    await db.execute(age, ids[0], 31.0)
    await db.execute(age, ids[1], 26.0)
    assert await queue.reclaim_stale_jobs() == []
    await db.execute(age, ids[1], 31.0)
    reclaimed = await queue.reclaim_stale_jobs()
    assert [(r.id, r.status, r.alone) for r in reclaimed] == \
        [(i, JobStatus.PENDING, False) for i in ids]
    assert {r["attempts"] for r in (await job_rows(db, ids)).values()} == {0}


async def test_a_job_its_live_process_does_not_know_it_holds_is_taken_back(
        db: Database) -> None:
    """A process that holds a job unknowingly (its ack claimed it, and the
    answer was lost) never heartbeats it. The sweeper waits for a process's
    last job to go stale, which a busy process never lets happen; after
    twice stale_after such a job is taken back anyway, uncharged."""
    queue = Queue(db, QueueSettings(stale_after=30.0))
    ids = [int(i) for i in await queue.enqueue_many(
        [NewJob(JobType.INDEX, "acme", f"o{n}", {}, max_attempts=1) for n in range(2)])]
    assert [j.id for j in await queue.claim(1, "host:8#b/0")] == ids[:1]
    assert [j.id for j in await queue.claim(1, "host:8#b/1")] == ids[1:]  # live, fresh
    await db.execute("UPDATE mail_index_jobs SET heartbeat_at = now() - interval '45 s' "
                     "WHERE id = $1", ids[0])
    assert await queue.reclaim_stale_jobs() == []
    await db.execute("UPDATE mail_index_jobs SET heartbeat_at = now() - interval '61 s' "
                     "WHERE id = $1", ids[0])
    reclaimed = await queue.reclaim_stale_jobs()
    assert [(r.id, r.status, r.alone) for r in reclaimed] == [(ids[0], JobStatus.PENDING, False)]
    rows = await job_rows(db, ids)
    assert rows[ids[1]]["status"] == "processing"
    # Its process lives on: no suspect, so not isolated (an isolated job
    # ready holds up every other claim until it has run: a review).
    assert (rows[ids[0]]["attempts"], rows[ids[0]]["isolate"]) == (0, False)
    assert "held it unconfirmed" in rows[ids[0]]["last_error"]


async def test_a_hand_back_takes_its_jobs_whatever_their_age(db: Database) -> None:
    """With the default timeouts (a command timeout of 60 s, stale_after 30 s)
    a worker notices a claim's lost answer when the jobs it took are older
    than stale_after. The hand-back left out such jobs (they were a dead
    process's of the same name, before each start had its own name), so it
    left out every job it was meant for (a review). Another task's jobs, and
    the jobs the task knows, stay where they are."""
    queue = Queue(db, QueueSettings(stale_after=30.0))
    ids = [int(i) for i in await queue.enqueue_many(
        [NewJob(JobType.INDEX, "acme", f"h{n}", {}) for n in range(4)])]
    assert [j.id for j in await queue.claim(2, "host:9#c/0")] == ids[:2]
    assert [j.id for j in await queue.claim(1, "host:9#c/1")] == ids[2:3]
    assert [j.id for j in await queue.claim(1, "host:9#d/0")] == ids[3:]
    await db.execute("UPDATE mail_index_jobs SET heartbeat_at = now() - interval '61 s'")
    assert await queue.release_unknown("host:9#c/0", [JobId(ids[1])]) == [ids[0]]
    rows = await job_rows(db, ids)
    assert (rows[ids[0]]["status"], rows[ids[0]]["attempts"]) == ("pending", 0)
    assert [rows[i]["status"] for i in ids[1:]] == ["processing"] * 3


async def test_a_dead_batch_is_not_charged_and_its_jobs_then_run_alone(db: Database) -> None:
    """The rule in SQL, without processes: a batch's attempts are refunded,
    its jobs are claimed one at a time, and a job that dies alone is charged."""
    queue = Queue(db, QueueSettings(stale_after=0.3, heartbeat_interval=0.1))
    ids = [int(i) for i in await queue.enqueue_many(
        [NewJob(JobType.INDEX, "acme", f"m{n}", {}, max_attempts=2) for n in range(3)])]
    assert len(await queue.claim(10, "dead")) == 3
    await trio.sleep(0.5)
    reclaimed = await queue.reclaim_stale_jobs()
    assert [(r.id, r.status, r.alone) for r in reclaimed] == \
        [(i, JobStatus.PENDING, False) for i in ids]
    assert {r["attempts"] for r in (await job_rows(db, ids)).values()} == {0}

    alone = await queue.claim(10, "next")
    assert [j.id for j in alone] == ids[:1] and alone[0].attempts == 1
    await trio.sleep(0.5)
    assert [(r.id, r.alone) for r in await queue.reclaim_stale_jobs()] == [(ids[0], True)]
    row = (await job_rows(db, ids[:1]))[ids[0]]
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert "suspected of killing its worker" in row["last_error"]

    # The innocent ones run alone and succeed on their first counted attempt.
    for expected in ids[1:]:
        job = await queue.claim(10, "next")
        assert [j.id for j in job] == [expected]
        await queue.complete(job)
    # The suspect dies alone once more: its last attempt, failed.
    assert [j.id for j in await queue.claim(10, "next")] == ids[:1]
    await trio.sleep(0.5)
    assert await queue.reclaim_stale() == {ids[0]: JobStatus.FAILED}
