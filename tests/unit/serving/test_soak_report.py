"""The chaos soak's report: each request counts against the kill before it ended."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[3] / "load_tests" / "soak.py"


def _soak():
    spec = importlib.util.spec_from_file_location("facefuse_soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_failure_caused_by_the_next_kill_is_not_counted_from_15_s_of_the_previous_one():
    soak = _soak()
    chaos = soak.Chaos(server_pid=0, every=60, health_url=None, seed=0, t0=0.0)
    chaos.kills = [{"t_s": 60.0, "model": "unet", "pid": 1},
                   {"t_s": 120.0, "model": "vae_decoder", "pid": 2}]  # fmt: skip
    tally = soak.Tally()
    tally.requests = [
        (58.0, 61.0, False, "unavailable"),  # in flight at the first kill: the first's
        (62.0, 66.0, True, ""),
        (80.0, 84.0, True, ""),  # from 15 s after the first kill: ok
        (118.0, 121.0, False, "unavailable"),  # sent before the second kill, failed by it
        (140.0, 143.0, True, ""),
    ]
    report = soak.Chaos.report(chaos, tally, end=150.0, timeout_s=120.0)
    first, second = report["per_kill"]
    assert first["failed"] == 1 and first["ok_share_from_15_s"] == 1.0
    assert second["failed"] == 1 and second["ok_share_from_15_s"] == 1.0
    assert report["ok_share_from_15_s"] == 1.0 and report["hangs"] == 0
    assert report["requests"] == 5 and report["ok"] == 3
