#!/usr/bin/env python
"""MIME parse throughput: ``nexarch_events.mail.mime`` on realistic mail, one core.

    .venv/bin/python bench/mime_bench.py [--count 3000] [--repeat 5] [--seed 0]
                                         [--baseline] [--hostile] [--profile]

Generates ``--count`` realistic 2-50 KB messages (tests/support/mailgen.py:
German and English, plain, multipart/alternative, HTML only, attachments,
forwarded mail; generation is not timed), parses each with ``parse_message``
and builds its ``IndexDocument`` (what an index worker does per message),
and reports the best of ``--repeat`` rounds in messages/s and MB/s, by wall
clock and by process CPU time (CPU time is the fairer figure on a busy
machine; the load average is printed so a reader can judge).

``--baseline`` also times the stdlib parser (compat32 policy: parse, walk,
decode every payload) on the same messages, for scale. ``--hostile`` times
each message of the hostile corpus once (the 50 MB ones included; builds
~110 MB of test data). ``--profile`` prints the top functions of one round.
"""

from __future__ import annotations

import argparse
import cProfile
import email.parser
import email.policy
import os
import platform
import pstats
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nexarch_events.mail.mime import MimeError, parse_message, to_index_document
from tests.support.mailgen import hostile_messages, realistic_messages


def _index_one(raw: bytes) -> None:
    to_index_document(parse_message(raw), archive_id=1, tenant_slug="bench",
                      size_bytes=len(raw))


def _stdlib_one(raw: bytes) -> None:
    message = email.parser.BytesParser(policy=email.policy.compat32).parsebytes(raw)
    for part in message.walk():
        part.get_payload(decode=True)


def _rounds(messages: Sequence[bytes], one: Callable[[bytes], None], repeat: int
            ) -> tuple[float, float]:
    """Best (wall seconds, CPU seconds) of ``repeat`` rounds over all messages."""
    best_wall = best_cpu = float("inf")
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        for raw in messages:
            one(raw)
        best_wall = min(best_wall, time.perf_counter() - wall)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    return best_wall, best_cpu


def _report(name: str, count: int, size: int, wall: float, cpu: float) -> None:
    print(f"{name:<28} {count / wall:8.0f} msg/s wall {count / cpu:8.0f} msg/s cpu "
          f"{size / cpu / 1e6:7.1f} MB/s cpu  {cpu / count * 1e6:7.1f} us/msg cpu")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", action="store_true")
    parser.add_argument("--hostile", action="store_true")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    messages = list(realistic_messages(args.count, seed=args.seed))
    size = sum(map(len, messages))
    print(f"python {platform.python_version()} on {platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print(f"{len(messages)} realistic messages, {size / 1e6:.1f} MB, "
          f"{size / len(messages) / 1024:.1f} KB average "
          f"(min {min(map(len, messages)) / 1024:.1f}, "
          f"max {max(map(len, messages)) / 1024:.1f}); "
          f"generated in {time.perf_counter() - started:.1f} s")

    for raw in messages[:200]:  # warm caches (codec lookups, regex compilation)
        _index_one(raw)
    wall, cpu = _rounds(messages, _index_one, args.repeat)
    _report("parse + IndexDocument", len(messages), size, wall, cpu)
    html_only = [m for m in messages if b"text/plain" not in m]
    if html_only:
        wall, cpu = _rounds(html_only, _index_one, args.repeat)
        _report(f"  of which HTML only ({len(html_only)})", len(html_only),
                sum(map(len, html_only)), wall, cpu)
    if args.baseline:
        wall, cpu = _rounds(messages, _stdlib_one, max(1, args.repeat // 2))
        _report("stdlib compat32 parse+decode", len(messages), size, wall, cpu)
    print(f"load average after: {os.getloadavg()[0]:.2f}")

    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(_rounds, messages, _index_one, 1)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)

    if args.hostile:
        print("\nhostile corpus, one parse each:")
        for name, raw in hostile_messages():
            wall = time.perf_counter()
            try:
                parsed = parse_message(raw)
                outcome = f"document, {len(parsed.notes)} notes"
            except MimeError as exc:
                outcome = f"MimeError: {str(exc)[:60]}"
            print(f"  {name:<38} {len(raw) / 1e6:8.2f} MB "
                  f"{(time.perf_counter() - wall) * 1000:9.1f} ms  {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
