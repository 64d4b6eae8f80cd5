"""A/B of the supervisor on a healthy server (issue 33): ``facefuse serve`` with and without
``--no-supervisor``, alternating on, off, on, off, each for the same load (4 users of STEPS=4
fusions for ``seconds``); prints requests/s, p50 latency and the CPU the launcher process (the
supervisor's thread and its health calls; tritonserver is a child) used per second.

    python load_tests/supervisor_overhead.py --repository model_repository --seconds 60
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

USERS = 4


def run(repository: Path, mode: str, seconds: float) -> dict:
    import psutil
    from facefuse.client import NO_RETRY, Client

    from facefuse.core.samples import sample_pair

    source, target = sample_pair()
    command = [sys.executable, "-m", "facefuse.cli", "serve", "--repository", str(repository)]
    command += ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--health-port", "0"]
    if mode == "off":
        command.append("--no-supervisor")
    serve = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(serve.stdout), daemon=True).start()
    try:
        while not any(line.startswith("Ctrl-C") for line in lines):
            if serve.poll() is not None:
                raise SystemExit("facefuse serve exited:\n" + "".join(lines[-20:]))
            time.sleep(0.2)
        http = re.search(r"HTTP (127\.0\.0\.1:\d+)", "".join(lines)).group(1)
        with Client(http, "http", retry=NO_RETRY) as client:  # warm-up
            for _ in range(2):
                client.fuse(source, target, "make her smile", steps=4)
        latencies: list[float] = []
        stop = threading.Event()

        def user():
            with Client(http, "http", retry=NO_RETRY) as client:
                while not stop.is_set():
                    started = time.perf_counter()
                    client.fuse(source, target, "make her smile", steps=4)
                    latencies.append(time.perf_counter() - started)

        launcher = psutil.Process(serve.pid)
        cpu_before = sum(launcher.cpu_times()[:2])
        users = [threading.Thread(target=user) for _ in range(USERS)]
        started = time.perf_counter()
        for thread in users:
            thread.start()
        time.sleep(seconds)
        stop.set()
        for thread in users:
            thread.join()
        wall = time.perf_counter() - started
        cpu = sum(launcher.cpu_times()[:2]) - cpu_before
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=120)
    return {
        "supervisor": mode,
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / wall, 3),
        "p50_s": round(statistics.median(latencies), 3),
        "launcher_cpu_s_per_s": round(cpu / wall, 4),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, required=True, help="an exported repository")
    parser.add_argument("--seconds", type=float, default=60, help="seconds of load per run")
    parser.add_argument("--out", type=Path, default=None, help="write the runs as JSON here")
    args = parser.parse_args(argv)
    if not args.repository.is_dir():
        parser.error(f"--repository {args.repository}: not a directory")
    if not 5 <= args.seconds <= 3600:
        parser.error(f"--seconds {args.seconds}: expected 5..3600")
    runs = [run(args.repository, mode, args.seconds) for mode in ("on", "off", "on", "off")]
    text = json.dumps(runs, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
