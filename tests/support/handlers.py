"""Job handlers for crash tests, in worker processes and in-process.

Each handler appends one line per event to an effects file, so a test can
see afterwards which process ran which job, in which order, how often:

    <kind> TAB <job id> TAB <pid> TAB <job type> TAB <message id> TAB <attempts> TAB <time.time()>

``kind`` is ``start`` (the handler began), ``done`` (the job's effect, written
only when the job succeeds) or ``fail`` (a planned failure). The file is
opened with O_APPEND for every line, so lines of concurrent processes never
interleave and the file order is the real order of the writes.

Payload fields the handler obeys:

- ``sleep``: seconds to sleep before finishing (a slow job);
- ``sleep_attempts``: sleep only on attempts up to this number (so a job that
  was slow for a killed worker is quick for the worker that takes it over);
- ``fail_times``: fail (with a retry) while ``job.attempts`` is at most this;
- ``kill``: SIGKILL the handler's own process (a poison job); worker
  processes only.

Worker processes get the effects file from ``NEXARCH_TEST_EFFECTS`` and load
``--handlers tests.support.handlers:HANDLERS``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

from nexarch_events.models import ClaimedJob
from nexarch_events.queue.worker import BatchHandler, JobHandler, per_job

EFFECTS_ENV = "NEXARCH_TEST_EFFECTS"


@dataclass(frozen=True, slots=True)
class Effect:
    kind: str
    job_id: int
    pid: int
    job_type: str
    message_id: str
    attempts: int
    at: float


def record(path: str | os.PathLike[str], kind: str, job: ClaimedJob) -> None:
    line = "\t".join([kind, str(job.id), str(os.getpid()), job.job_type.value, job.message_id,
                      str(job.attempts), f"{time.time():.6f}"]) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def read_effects(path: str | os.PathLike[str]) -> list[Effect]:
    """Every complete line of the effects file, in file (= write) order."""
    p = Path(path)
    if not p.exists():
        return []
    effects = []
    for line in p.read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) != 7:
            continue
        kind, job_id, pid, job_type, message_id, attempts, at = parts
        effects.append(Effect(kind, int(job_id), int(pid), job_type, message_id, int(attempts),
                              float(at)))
    return effects


def _number(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def make_job_handler(effects_path: str | os.PathLike[str] | None = None) -> JobHandler:
    """The per-job handler; ``effects_path`` None = ``$NEXARCH_TEST_EFFECTS``."""

    def path() -> str | os.PathLike[str]:
        return effects_path if effects_path is not None else os.environ[EFFECTS_ENV]

    async def handle(job: ClaimedJob) -> None:
        record(path(), "start", job)
        if job.payload.get("kill") is True:
            os.kill(os.getpid(), signal.SIGKILL)
        sleep = _number(job.payload.get("sleep"))
        sleep_attempts = _number(job.payload.get("sleep_attempts"))
        if sleep and (sleep_attempts is None or job.attempts <= sleep_attempts):
            await trio.sleep(sleep)
        fail_times = _number(job.payload.get("fail_times"))
        if fail_times is not None and job.attempts <= fail_times:
            record(path(), "fail", job)
            raise RuntimeError(f"planned failure on attempt {job.attempts} of {fail_times:g}")
        record(path(), "done", job)

    return handle


def make_handlers(effects_path: str | os.PathLike[str] | None = None) -> Mapping[str,
                                                                              BatchHandler]:
    handler = per_job(make_job_handler(effects_path))
    return {"index": handler, "delete": handler}


#: For ``nexarch-events worker --handlers tests.support.handlers:HANDLERS``.
HANDLERS: Mapping[str, BatchHandler] = make_handlers()
