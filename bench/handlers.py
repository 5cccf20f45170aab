"""No-op batch handlers for the benchmark's worker processes.

``--handlers bench.handlers:NOOP``  does nothing and succeeds (drain runs).
``--handlers bench.handlers:TIMED`` does nothing either, but first records
``<job id> <time.time()>`` per job at handler start into
``$NEXARCH_BENCH_HANDLER_LOG/handler-<pid>.log`` (latency runs). The
benchmark joins these lines with the producer's commit times by job id.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

_out: IO[str] | None = None


def _log() -> IO[str]:
    global _out
    if _out is None:
        folder = os.environ["NEXARCH_BENCH_HANDLER_LOG"]
        _out = open(os.path.join(folder, f"handler-{os.getpid()}.log"), "a",
                    encoding="ascii")
    return _out


async def noop(jobs: Sequence[Any]) -> Mapping[Any, Any]:
    return {}


async def timed(jobs: Sequence[Any]) -> Mapping[Any, Any]:
    started = time.time()
    out = _log()
    out.write("".join(f"{job.id} {started:.6f}\n" for job in jobs))
    out.flush()  # one write(2) per batch; taken after the timestamp
    return {}


NOOP: Mapping[str, Any] = {"index": noop, "delete": noop}
TIMED: Mapping[str, Any] = {"index": timed, "delete": timed}
