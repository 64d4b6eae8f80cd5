"""The Locust file runs headless against a real server: valid requests succeed, malformed
ones are refused with 400 (both count as successes), nothing fails."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
LOCUSTFILE = Path(__file__).resolve().parents[2] / "load_tests" / "locustfile.py"


def run_locust(locustfile, host: str, prefix, timeout: float, **env) -> subprocess.CompletedProcess:
    """Locust headless in a subprocess (importing locust here would gevent-patch pytest)."""
    return subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "--host", host,
         "--csv", str(prefix), "--only-summary"],
        env=dict(os.environ, **env), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_locust_step_load_has_no_failures(server, tmp_path):
    # find_spec, not import: importing locust monkey-patches this process with gevent
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust is not installed")
    prefix = tmp_path / "locust"
    completed = run_locust(
        LOCUSTFILE, f"http://{server.http_url}", prefix, timeout=180, FACEFUSE_STEPS="2",
        FACEFUSE_BAD_SHARE="0.4", FACEFUSE_MAX_USERS="2", FACEFUSE_STEP_SECONDS="5",
        FACEFUSE_DURATION="25",
    )  # fmt: skip
    rows = {row["Name"]: row for row in csv.DictReader(open(f"{prefix}_stats.csv"))}
    assert completed.returncode == 0, completed.stderr[-3000:]
    total = rows["Aggregated"]
    assert int(total["Request Count"]) >= 3
    assert int(total["Failure Count"]) == 0, completed.stderr[-3000:]
    assert int(rows["facefusion"]["Request Count"]) >= 1
    assert any(name.startswith("facefusion [") for name in rows), rows.keys()


STREAM_LOCUSTFILE = LOCUSTFILE.with_name("locustfile_stream.py")


@pytest.mark.parametrize("live", ["0", "1"])
def test_locust_stream_users_fuse_clips_without_failures(server, tmp_path, live):
    """Two stream users against a real server: every frame answered (or, live, dropped by the
    server), each user's frames/s and latency written, no failure in Locust's statistics."""
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust is not installed")
    prefix = tmp_path / "stream"
    completed = run_locust(
        STREAM_LOCUSTFILE, f"grpc://{server.grpc_url}", prefix, timeout=240, FACEFUSE_LIVE=live,
        FACEFUSE_STREAM_FRAMES="6", FACEFUSE_MAX_USERS="2", FACEFUSE_STEP_USERS="2",
        FACEFUSE_STEP_SECONDS="5", FACEFUSE_DURATION="20",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = {row["Name"]: row for row in csv.DictReader(open(f"{prefix}_stats.csv"))}
    assert int(rows["Aggregated"]["Failure Count"]) == 0, completed.stderr[-3000:]
    streams = int(rows["stream"]["Request Count"])
    frames = int(rows["stream frame"]["Request Count"])
    dropped = int(rows.get("stream frame [dropped]", {}).get("Request Count", 0))
    assert streams >= 2 and frames >= 1
    assert frames + dropped >= 6 * streams  # every frame of every finished clip came back
    if live == "0":
        assert dropped == 0
    users = list(csv.DictReader(open(f"{prefix}_stream_users.csv")))
    assert len(users) == 2
    for user in users:
        assert float(user["frames_per_s"]) > 0 and float(user["latency_ms_p95"]) > 0
