"""Closed-loop load generation and process CPU accounting for the benchmarks.

:func:`run_closed_loop` keeps ``concurrency`` requests in flight until ``requests`` have
completed; :func:`tree_cpu_seconds` sums user+system CPU of a process and its descendants
from /proc (Linux), so the CPU cost of a Triton server includes its stub processes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np


@dataclass
class LoadResult:
    """Latencies (s) of completed requests, wall time and CPU seconds spent."""

    concurrency: int
    latencies: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    failures: int = 0

    @property
    def requests_per_s(self) -> float:
        return len(self.latencies) / self.wall_s if self.wall_s else 0.0

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies, q) * 1000) if self.latencies else float("nan")

    @property
    def cpu_s_per_image(self) -> float:
        return self.cpu_s / len(self.latencies) if self.latencies else float("nan")

    def summary(self) -> dict:
        return {
            "concurrency": self.concurrency,
            "requests": len(self.latencies),
            "failures": self.failures,
            "requests_per_s": round(self.requests_per_s, 4),
            "p50_ms": round(self.percentile_ms(50), 1),
            "p95_ms": round(self.percentile_ms(95), 1),
            "cpu_s_per_image": round(self.cpu_s_per_image, 3),
            "wall_s": round(self.wall_s, 2),
        }


def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root_pid: int) -> float:
    """User+system CPU seconds of ``root_pid`` and all its live descendants."""
    parents: dict[int, int] = {}
    cpu: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = int(fields[11]) + int(fields[12])
    members, frontier = {root_pid}, [root_pid]
    while frontier:
        pid = frontier.pop()
        children = [p for p, parent in parents.items() if parent == pid and p not in members]
        members.update(children)
        frontier.extend(children)
    return sum(cpu.get(pid, 0) for pid in members) / _clock_ticks()


def self_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def run_closed_loop(
    call: Callable[[int], object],
    concurrency: int,
    requests: int,
    cpu_clock: Callable[[], float] = self_cpu_seconds,
) -> LoadResult:
    """Issue ``requests`` calls ``call(i)``, at most ``concurrency`` at a time."""
    result = LoadResult(concurrency=concurrency)

    def one(index: int) -> None:
        started = time.perf_counter()
        try:
            call(index)
        except Exception:
            result.failures += 1
            return
        result.latencies.append(time.perf_counter() - started)

    cpu_before, started = cpu_clock(), time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, range(requests)))
    result.wall_s = time.perf_counter() - started
    result.cpu_s = cpu_clock() - cpu_before
    return result
