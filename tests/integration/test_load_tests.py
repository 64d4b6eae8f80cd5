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


def test_locust_step_load_has_no_failures(server, tmp_path):
    # find_spec, not import: importing locust monkey-patches this process with gevent
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust is not installed")
    env = dict(
        os.environ,
        FACEFUSE_STEPS="2",
        FACEFUSE_BAD_SHARE="0.4",
        FACEFUSE_MAX_USERS="2",
        FACEFUSE_STEP_SECONDS="5",
        FACEFUSE_DURATION="25",
    )
    prefix = tmp_path / "locust"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(LOCUSTFILE),
            "--headless",
            "--host",
            f"http://{server.http_url}",
            "--csv",
            str(prefix),
            "--only-summary",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    rows = {row["Name"]: row for row in csv.DictReader(open(f"{prefix}_stats.csv"))}
    assert completed.returncode == 0, completed.stderr[-3000:]
    total = rows["Aggregated"]
    assert int(total["Request Count"]) >= 3
    assert int(total["Failure Count"]) == 0, completed.stderr[-3000:]
    assert int(rows["facefusion"]["Request Count"]) >= 1
    assert any(name.startswith("facefusion [") for name in rows), rows.keys()
