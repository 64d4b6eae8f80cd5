"""Health of the prefix cache: metrics sinks, the sliding-window hit rate, and the frequency of
recent prefixes from which the cache rebuilds its templates.

numpy-free and Triton-free: :class:`TritonMetricsSink` receives the ``pb_utils`` module from the
Triton model, so tests use :class:`InMemoryMetrics` and no server.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from typing import Protocol

from facefuse.core import metrics as names

# name -> (kind, description); kinds are pb_utils.MetricFamily attribute names.
CACHE_METRICS: dict[str, tuple[str, str]] = {
    names.PREFIX_CACHE_REQUESTS: ("COUNTER", "Prompts looked up in the text-encoder prefix cache"),
    names.PREFIX_CACHE_HITS: ("COUNTER", "Prompts that reused a cached prefix (or exact repeat)"),
    names.PREFIX_CACHE_FULL_HITS: ("COUNTER", "Exact repeats served without running the encoder"),
    names.PREFIX_CACHE_HIT_TOKENS: ("COUNTER", "Token positions reused from the cache"),
    names.PREFIX_CACHE_BYTES: ("GAUGE", "Bytes held by the prefix cache"),
    names.PREFIX_CACHE_EVICTIONS: ("COUNTER", "Cache entries evicted to stay within the budget"),
    names.PREFIX_CACHE_REBUILDS: ("COUNTER", "Rebuilds from the most frequent recent prefixes"),
    names.PREFIX_CACHE_HIT_RATE: ("GAUGE", "Hit rate over the sliding window"),
}


class MetricsSink(Protocol):
    """Where the cache reports: counters only grow, gauges are set."""

    def increment(self, name: str, value: float = 1.0) -> None: ...

    def set(self, name: str, value: float) -> None: ...


class NullMetrics:
    """A sink that drops everything."""

    def increment(self, name: str, value: float = 1.0) -> None:
        return None

    def set(self, name: str, value: float) -> None:
        return None


class InMemoryMetrics:
    """Thread-safe in-memory sink (tests, benchmark)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, float] = {}
        self.gauges: dict[str, float] = {}

    def increment(self, name: str, value: float = 1.0) -> None:
        if value < 0:
            raise ValueError(f"counter {name} cannot decrease (got {value})")
        with self._lock:
            self.counters[name] = self.counters.get(name, 0.0) + value

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self.gauges[name] = float(value)


class TritonMetricsSink:
    """Maps the cache metrics onto ``pb_utils.MetricFamily`` (create in ``initialize``).
    ``lock``: held around every metric call (the serving layer's process-wide metric lock;
    the stub's metric API is not thread-safe)."""

    def __init__(self, pb_utils, labels: dict[str, str] | None = None, lock=None):
        self._lock = lock if lock is not None else threading.RLock()
        self._families = {}
        self._metrics = {}
        with self._lock:
            for name, (kind, description) in CACHE_METRICS.items():
                family = pb_utils.MetricFamily(
                    name=name, description=description, kind=getattr(pb_utils.MetricFamily, kind)
                )
                self._families[name] = family
                self._metrics[name] = family.Metric(labels=dict(labels or {}))

    def increment(self, name: str, value: float = 1.0) -> None:
        if value:
            with self._lock:
                self._metrics[name].increment(value)

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self._metrics[name].set(value)


class HitRateWindow:
    """Hit rate over the last ``size`` lookups. ``full`` once ``size`` lookups were recorded."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"window size must be >= 1, got {size}")
        self.size = size
        self._events: deque[bool] = deque(maxlen=size)
        self._hits = 0
        self._lock = threading.Lock()

    def record(self, hits: Iterable[bool]) -> None:
        with self._lock:
            for hit in hits:
                if len(self._events) == self.size:
                    self._hits -= self._events[0]
                self._events.append(bool(hit))
                self._hits += bool(hit)

    @property
    def full(self) -> bool:
        return len(self._events) == self.size

    @property
    def rate(self) -> float:
        with self._lock:
            return self._hits / len(self._events) if self._events else 0.0

    def reset(self) -> None:
        with self._lock:
            self._events.clear()
            self._hits = 0


class PrefixFrequency:
    """The cacheable prefixes (token ids before the first eos) of the last ``size`` prompts,
    and the templates they share."""

    def __init__(self, size: int):
        self._recent: deque[tuple[int, ...]] = deque(maxlen=size)
        self._lock = threading.Lock()

    def record(self, prefixes: Iterable[Sequence[int]]) -> None:
        with self._lock:
            self._recent.extend(tuple(int(t) for t in p) for p in prefixes)

    def __len__(self) -> int:
        return len(self._recent)

    def top_prefixes(
        self, max_templates: int, min_tokens: int, min_support: int = 2
    ) -> list[tuple[int, ...]]:
        """Shared prefixes ranked by tokens saved over the window (``support x length``).

        A candidate is a prefix of at least ``min_tokens`` tokens shared by at least
        ``min_support`` recent prompts, at a point where those prompts diverge (or end): its
        support is larger than that of any single extension, so a template is returned whole
        rather than as its stem.
        """
        with self._lock:
            recent = list(self._recent)
        support: Counter[tuple[int, ...]] = Counter()
        for seq in recent:
            for end in range(min_tokens, len(seq) + 1):
                support[seq[:end]] += 1
        best_child: dict[tuple[int, ...], int] = {}
        for prefix, count in support.items():
            if len(prefix) > min_tokens:
                parent = prefix[:-1]
                best_child[parent] = max(best_child.get(parent, 0), count)
        candidates = [
            (count * len(prefix), prefix)
            for prefix, count in support.items()
            if count >= min_support and count > best_child.get(prefix, 0)
        ]
        candidates.sort(key=lambda item: (-item[0], item[1]))
        return [prefix for _, prefix in candidates[:max_templates]]
