"""Soak test: N concurrent users against a facefuse server for D seconds, RSS recorded.

Either starts its own server on a model repository (``--repository``) or drives one that
runs on this machine (``--url`` + ``--server-pid``). Every few seconds it records the RSS of
the tritonserver process and of each Python-backend stub (one per model instance), and the
prefix cache's ``facefuse_prefix_cache_bytes`` gauge when a metrics URL is known. It writes

  reports/soak_rss.csv      t_s, process, pid, rss_mb (one row per process per sample)
  reports/soak_rss.png      RSS over time per process and in total, warm-up shaded
  reports/soak_summary.json requests, errors, RSS growth after warm-up in percent

RSS growth after warm-up compares the median total RSS (server + stubs) of the first 10% of
samples after warm-up with the median of the last 10%. Bounded: ``--duration`` seconds and
at most ``--max-requests`` requests; loopback addresses only.

    python load_tests/soak.py --repository model_repository --users 4 --duration 600

Chaos mode (issue 33): ``--kill-every 60`` SIGKILLs the process of a random Python-backend
model (a ``triton_python_backend_stub`` child of tritonserver) every 60 s, while the
supervisor (``facefuse.serving.supervisor``: started here with ``--repository``; with
``--url``, the server must be ``facefuse serve`` and ``--health-url`` its supervisor) replaces
it. It also polls the supervisor's ``/ready`` and ``/live`` and writes
``reports/soak_chaos.json``: per kill the model, the requests that failed, the seconds to the
first success of a request sent after the kill, the share of requests sent from 15 s after the
kill that succeeded, and what the probes said; over the run the failures by class (a clean
503/UNAVAILABLE "try again", a timeout, anything else) and the longest request.

    python load_tests/soak.py --repository model_repository --users 4 --duration 600 \
        --kill-every 60 --out reports/soak-chaos
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import signal
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
STUB = "triton_python_backend_stub"
INSTRUCTIONS = (
    "make her smile, keep the glasses",
    "make him look ten years younger",
    "soft studio light, keep the hair",
    "add a gentle smile and warm light",
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Concurrent face-fusion users for a bounded time; records server and stub "
        "RSS, writes CSV + PNG chart + JSON summary, reports RSS growth after warm-up."
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--repository", type=Path, help="start a server on this repository")
    where.add_argument("--url", help="HTTP host:port of a running server (loopback only)")
    parser.add_argument("--server-pid", type=int, help="tritonserver pid (with --url)")
    parser.add_argument("--metrics-url", help="metrics URL (with --url), for the cache gauge")
    parser.add_argument("--users", type=int, default=4, help="concurrent users (default 4)")
    parser.add_argument("--duration", type=float, default=600, help="seconds of load (600)")
    parser.add_argument(
        "--warmup", type=float, default=None, help="seconds excluded from growth (default: 20%%)"
    )
    parser.add_argument("--max-requests", type=int, default=100_000, help="stop after this many")
    parser.add_argument("--steps", type=int, default=4, help="STEPS per request (default 4)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="output folder")
    parser.add_argument(
        "--max-growth-pct", type=float, default=None, help="exit 1 when growth exceeds this"
    )
    parser.add_argument(
        "--kill-every",
        type=float,
        default=None,
        help="chaos: SIGKILL a random model process every this many seconds (e.g. 60)",
    )
    parser.add_argument(
        "--health-url",
        default=None,
        help="the supervisor's base URL (with --url), e.g. http://127.0.0.1:8003",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=120.0,
        help="seconds a request may take before it counts as a timeout (default 120)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed of the chaos victims")
    args = parser.parse_args(argv)
    if args.kill_every is not None and not 5 <= args.kill_every <= 3600:
        parser.error(f"--kill-every {args.kill_every}: expected 5..3600 seconds")
    if not 1 <= args.request_timeout <= 3600:
        parser.error(f"--request-timeout {args.request_timeout}: expected 1..3600 seconds")
    if args.health_url is not None and not args.health_url.startswith(
        tuple(f"http://{h}" for h in LOOPBACK)
    ):
        parser.error(f"--health-url {args.health_url}: loopback http only")
    if args.url is not None:
        host = args.url.rsplit(":", 1)[0]
        if host not in LOOPBACK:
            parser.error(f"--url {args.url}: loopback only (127.0.0.1:PORT)")
        metrics = args.metrics_url or "http://127.0.0.1/"
        if not metrics.startswith(tuple(f"http://{h}" for h in LOOPBACK)):
            parser.error(f"--metrics-url {args.metrics_url}: loopback http only")
        if args.server_pid is None:
            parser.error("--url needs --server-pid (RSS is read from /proc on this machine)")
    if args.users < 1 or args.duration <= 0 or args.max_requests < 1:
        parser.error("--users, --duration and --max-requests must be positive")
    if args.warmup is None:
        args.warmup = 0.2 * args.duration
    if not 0 <= args.warmup < args.duration:
        parser.error("--warmup must be in [0, duration)")
    return args


def process_table(server_pid: int) -> list[tuple[str, int, float]]:
    """(name, pid, rss MB) of the server and each stub; a stub is named by its model."""
    import psutil

    server = psutil.Process(server_pid)
    rows = [("tritonserver", server_pid, server.memory_info().rss / 2**20)]
    for child in server.children(recursive=True):
        try:
            cmdline = child.cmdline()
            if not cmdline or STUB not in cmdline[0]:
                continue
            model = Path(cmdline[1]).parts[-3] if len(cmdline) > 1 else "stub"
            rows.append((model, child.pid, child.memory_info().rss / 2**20))
        except psutil.Error:  # a stub that exited between listing and reading
            continue
    return rows


def cache_bytes(metrics_url: str | None) -> float | None:
    if not metrics_url:
        return None
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as response:  # noqa: S310 - checked
            text = response.read().decode()
    except OSError:
        return None
    values = re.findall(r"^facefuse_prefix_cache_bytes(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M)
    return sum(float(v) for v in values) if values else None


@dataclass
class Tally:
    ok: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # (sent, done, ok, failure class) of every request, seconds since the start
    requests: list[tuple[float, float, bool, str]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def total(self) -> int:
        with self.lock:
            return self.ok + self.failed


def user(index: int, url: str, args, tally: Tally, stop: threading.Event) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from facefuse.core import contract
    from facefuse.core.samples import sample_pair

    source, target = sample_pair()
    client = httpclient.InferenceServerClient(
        url, network_timeout=args.request_timeout, connection_timeout=args.request_timeout
    )

    n = 0
    try:
        while not stop.is_set() and tally.total() < args.max_requests:
            instruction = INSTRUCTIONS[(index + n) % len(INSTRUCTIONS)]
            request = contract.facefusion_request(
                source, target, instruction, steps=args.steps, seed=index * 100_000 + n
            )
            inputs = contract.infer_inputs(httpclient, contract.FACEFUSION, request)
            started = time.perf_counter()
            sent = time.monotonic() - tally.started
            try:
                client.infer(contract.FACEFUSION.name, inputs)
                with tally.lock:
                    tally.ok += 1
                    tally.latencies.append(time.perf_counter() - started)
                    tally.requests.append((sent, time.monotonic() - tally.started, True, ""))
            except (InferenceServerException, OSError) as exc:
                key = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
                with tally.lock:
                    tally.failed += 1
                    tally.errors[key] = tally.errors.get(key, 0) + 1
                    done = time.monotonic() - tally.started
                    tally.requests.append((sent, done, False, failure_class(exc)))
                    tally.latencies.append(time.perf_counter() - started)
                stop.wait(1.0)
            n += 1
    finally:
        client.close()


def failure_class(exc: BaseException) -> str:
    """ "unavailable": a clean "try again" answer (HTTP 503 naming the model and the retry hint,
    or Triton's own line when a pipeline's own process died or is being reloaded);
    "timeout": no answer within --request-timeout; "other": anything else."""
    text = str(exc)
    status = str(getattr(exc, "status", lambda: "")() or "")
    if "timed out" in text.lower() or isinstance(exc, TimeoutError):
        return "timeout"
    if status == "503" or any(
        m in text for m in ("is unavailable", "is not healthy", "unknown model", "is not ready")
    ):
        return "unavailable"
    return "other"


class Chaos:
    """Every ``every`` s, SIGKILL one random stub of ``server_pid``; poll /ready and /live."""

    def __init__(self, server_pid: int, every: float, health_url: str | None, seed: int, t0):
        self.server_pid, self.every, self.health_url = server_pid, every, health_url
        self.rng = random.Random(seed)
        self.t0 = t0
        self.kills: list[dict] = []
        self.probes: list[tuple[float, int | None, int | None]] = []  # t, ready, live

    def probe(self, path: str) -> int | None:
        try:
            with urllib.request.urlopen(self.health_url + path, timeout=5) as r:  # noqa: S310
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def run(self, stop: threading.Event) -> None:
        next_kill = self.every
        while not stop.is_set():
            t = time.monotonic() - self.t0
            if self.health_url:
                self.probes.append((t, self.probe("/ready"), self.probe("/live")))
            if t >= next_kill:
                stubs = [r for r in process_table(self.server_pid) if r[0] != "tritonserver"]
                if stubs:  # a random model, then one of its instances (facefusion has 4)
                    model = self.rng.choice(sorted({r[0] for r in stubs}))
                    _, pid, _ = self.rng.choice([r for r in stubs if r[0] == model])
                    try:
                        os.kill(pid, signal.SIGKILL)
                        self.kills.append({"t_s": round(t, 2), "model": model, "pid": pid})
                        print(f"chaos: t={t:.0f} s killed {model} (pid {pid})", flush=True)
                    except ProcessLookupError:
                        pass
                next_kill += self.every
            stop.wait(0.5)

    def report(self, tally: Tally, end: float, timeout_s: float) -> dict:
        with tally.lock:
            requests = list(tally.requests)
        per_kill, all_late = [], []
        for i, kill in enumerate(self.kills):
            t = kill["t_s"]
            until = self.kills[i + 1]["t_s"] if i + 1 < len(self.kills) else end
            # a request belongs to the kill before it ended: one sent just before the next
            # kill and failed by it is that kill's, not this one's "from 15 s" failure
            window = [r for r in requests if t <= r[1] < until]
            failed = [r for r in window if not r[2]]
            first_ok = min((r[1] for r in requests if r[2] and r[0] >= t), default=None)
            late = [r for r in window if r[0] >= t + 15]
            all_late.extend(late)
            probes = [p for p in self.probes if t <= p[0] < until]
            not_ready = [p for p in probes if p[1] != 200]
            back = next((p[0] for p in probes if p[0] > t and p[1] == 200 and not_ready
                         and p[0] > not_ready[0][0]), None)  # fmt: skip
            per_kill.append(
                {
                    **kill,
                    "requests": len(window),
                    "failed": len(failed),
                    "failed_by_class": _count(r[3] for r in failed),
                    "s_to_first_success": round(first_ok - t, 1) if first_ok else None,
                    "ok_share_from_15_s": round(sum(r[2] for r in late) / len(late), 4)
                    if late
                    else None,
                    "ready_503_polls": len(not_ready),
                    "ready_back_after_s": round(back - t, 1) if back else None,
                    "live_failed_polls": sum(1 for p in probes if p[2] != 200),
                }
            )
        failed = [r for r in requests if not r[2]]
        return {
            "kill_every_s": self.every,
            "kills": len(self.kills),
            "requests": len(requests),
            "ok": sum(r[2] for r in requests),
            "ok_share": round(sum(r[2] for r in requests) / len(requests), 4) if requests else None,
            "failed_by_class": _count(r[3] for r in failed),
            "longest_request_s": round(max((r[1] - r[0] for r in requests), default=0), 1),
            "request_timeout_s": timeout_s,
            "hangs": sum(1 for r in requests if r[1] - r[0] > timeout_s + 5),
            "ok_share_from_15_s": round(sum(r[2] for r in all_late) / len(all_late), 4)
            if all_late
            else None,
            "per_kill": per_kill,
        }


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def growth_pct(times: list[float], totals: list[float], warmup: float) -> float | None:
    after = [rss for t, rss in zip(times, totals) if t >= warmup]
    if len(after) < 4:
        return None
    window = max(1, len(after) // 10)
    first, last = statistics.median(after[:window]), statistics.median(after[-window:])
    return 100.0 * (last - first) / first


def chart(rows: list[dict], times, totals, warmup: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.5))
    by_process: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        label = f"{row['process']} ({row['pid']})"
        by_process.setdefault(label, []).append((row["t_s"], row["rss_mb"]))
    for label, points in sorted(by_process.items()):
        ax.plot(*zip(*points), linewidth=1, label=label)
    ax.plot(times, totals, color="black", linewidth=2, label="total")
    ax.axvspan(0, warmup, color="grey", alpha=0.15, label="warm-up")
    ax.set_xlabel("seconds")
    ax.set_ylabel("RSS (MiB)")
    ax.set_yscale("log")
    ax.set_title("facefuse soak: RSS of tritonserver and Python-backend stubs")
    ax.legend(fontsize=7, ncol=2, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def soak(
    args, url: str, server_pid: int, metrics_url: str | None, health_url: str | None = None
) -> dict:
    tally, stop = Tally(), threading.Event()
    threads = [
        threading.Thread(target=user, args=(i, url, args, tally, stop), daemon=True)
        for i in range(args.users)
    ]
    rows: list[dict] = []
    times, totals, cache = [], [], []
    started = tally.started
    chaos = None
    if args.kill_every:
        chaos = Chaos(server_pid, args.kill_every, health_url, args.seed, started)
        threads.append(threading.Thread(target=chaos.run, args=(stop,), daemon=True))
    for thread in threads:
        thread.start()
    while True:
        t = time.monotonic() - started
        table = process_table(server_pid)
        for name, pid, rss in table:
            rows.append({"t_s": round(t, 2), "process": name, "pid": pid, "rss_mb": round(rss, 2)})
        times.append(t)
        totals.append(sum(rss for _, _, rss in table))
        cache.append(cache_bytes(metrics_url))
        if t >= args.duration or tally.total() >= args.max_requests:
            break
        time.sleep(min(args.interval, max(0.0, args.duration - t)))
    stop.set()
    for thread in threads:
        thread.join(timeout=600)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "soak_rss.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["t_s", "process", "pid", "rss_mb"])
        writer.writeheader()
        writer.writerows(rows)
    chart(rows, times, totals, args.warmup, args.out / "soak_rss.png")
    elapsed = time.monotonic() - started
    known_cache = [c for c in cache if c is not None]
    latencies = sorted(tally.latencies)
    summary = {
        "users": args.users,
        "duration_s": round(elapsed, 1),
        "warmup_s": args.warmup,
        "steps": args.steps,
        "requests_ok": tally.ok,
        "requests_failed": tally.failed,
        "errors": tally.errors,
        "throughput_rps": round(tally.ok / elapsed, 3),
        "latency_p50_s": round(latencies[len(latencies) // 2], 3) if latencies else None,
        "samples": len(times),
        "rss_total_mb_start": round(totals[0], 1),
        "rss_total_mb_end": round(totals[-1], 1),
        "rss_total_mb_max": round(max(totals), 1),
        "rss_growth_after_warmup_pct": growth_pct(times, totals, args.warmup),
        "stub_processes": len({(r["process"], r["pid"]) for r in rows}) - 1,
        "prefix_cache_bytes_max": max(known_cache) if known_cache else None,
    }
    if summary["rss_growth_after_warmup_pct"] is not None:
        summary["rss_growth_after_warmup_pct"] = round(summary["rss_growth_after_warmup_pct"], 2)
    (args.out / "soak_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if chaos is not None:
        report = chaos.report(tally, elapsed, args.request_timeout)
        report["rss_growth_after_warmup_pct"] = summary["rss_growth_after_warmup_pct"]
        report["rss_total_mb_max"] = summary["rss_total_mb_max"]
        (args.out / "soak_chaos.json").write_text(json.dumps(report, indent=2) + "\n")
        summary["chaos"] = {k: v for k, v in report.items() if k != "per_kill"}
    return summary


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.repository is not None:
        from facefuse.serving.server import LocalTritonServer, ServerConfig
        from facefuse.serving.supervisor import Supervision, SupervisorSettings

        args.out.mkdir(parents=True, exist_ok=True)
        # as `facefuse serve` runs it: explicit model control, the supervisor beside it
        config = ServerConfig(repository=args.repository, model_control_explicit=True)
        print(f"starting tritonserver on {args.repository} ...", flush=True)
        with LocalTritonServer(config, log_path=args.out / "soak_server.log") as server:
            events = open(args.out / "soak_supervisor.log", "w")
            supervision = Supervision(
                server.http_url,
                server.process.pid,
                config.admin_key,
                # the soak kills on purpose, more often than a real fault: no give-up
                SupervisorSettings(max_reloads=100) if args.kill_every else SupervisorSettings(),
                health_port=0,
                log=lambda line: (events.write(line + "\n"), events.flush()),
            ).start()
            try:
                summary = soak(
                    args,
                    server.http_url,
                    server.process.pid,
                    server.metrics_url,
                    supervision.health_url,
                )
            finally:
                supervision.stop()
                events.close()
    else:
        summary = soak(args, args.url, args.server_pid, args.metrics_url, args.health_url)
    print(json.dumps(summary, indent=2))
    growth = summary["rss_growth_after_warmup_pct"]
    print(
        f"soak: {summary['users']} users, {summary['duration_s']} s, "
        f"{summary['requests_ok']} ok / {summary['requests_failed']} failed, "
        f"RSS {summary['rss_total_mb_start']} -> {summary['rss_total_mb_end']} MiB, "
        f"growth after warm-up {growth} %; wrote {args.out}/soak_rss.csv, soak_rss.png"
    )
    if args.max_growth_pct is not None and (growth is None or growth > args.max_growth_pct):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
