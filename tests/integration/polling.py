"""Bounded polling for the integration tests (not a timing assertion)."""

from __future__ import annotations

import time


def wait_for(condition, timeout_s: float, what: str, every_s: float = 0.2):
    """Poll ``condition`` until it returns a truthy value, which is returned; AssertionError
    naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"gave up after {timeout_s:.0f} s waiting for {what}")
