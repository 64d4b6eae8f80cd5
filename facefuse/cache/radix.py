"""Token-id radix tree of CLIP per-layer keys/values, with LRU eviction under a byte budget.

numpy only: the tree stores arrays and never runs a model, so all of its logic is unit-tested
on CPU with small fake arrays (the shapes are whatever the caller inserts).

Invariants (checked by :meth:`PrefixKVCache.check_invariants`, held under the lock after every
public call):

1. **Exactness by construction.** A node's arrays hold, for the token positions it covers, the
   keys/values (``kv`` [L, 2, n, D]), the output hidden rows (``hidden`` [n, D]) and, when the
   pooled output needs another layer, the final-layer-norm rows (``final`` [n, D]) computed for
   exactly the tokens on the path from the root to the end of the node. A causal encoder makes
   these depend on that path only, so any prompt that starts with the path may reuse them.
2. **Immutability.** Arrays are never written after insertion; a split copies. A match returns
   references, which stay valid after the node is split or evicted (eviction only drops the
   tree's reference; memory in flight belongs to the request that holds it).
3. **Namespaces.** Each :class:`CacheKey` (model identity, padding convention, clip_skip) has
   its own root: entries are only reused under the exact conditions they were computed in.
4. **Budget.** ``bytes_used`` is the sum of ``nbytes`` over all nodes and exact entries and is
   never above ``budget_bytes``. An item that cannot fit after evicting every evictable item is
   not inserted. Budget 0 disables the cache: every call is a no-op that stores nothing.
5. **No duplicates.** A token path is stored at most once per key (children are keyed by their
   first token and share no first token), and an exact entry at most once per (key, ids);
   inserting what is present only refreshes recency (concurrent identical inserts are safe).
6. **LRU order.** Every node is more recently used than each of its descendants (paths are
   touched from the leaf up), so the least recently used node is a leaf; only unpinned leaves
   and exact entries are evicted.
7. **Pins.** ``pins`` of a node is the number of pinned templates whose path passes through it;
   pinned nodes are never evicted and their bytes stay within ``pinned_fraction`` of the budget.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CacheKey:
    """Namespace of cache entries: results are only shared between equal keys."""

    model_id: str  # identity of the encoder weights/graphs (sha256 recorded at export)
    pad_token_id: int  # padding convention: 49407 (SD 1.x, eos) or 0 (SD 2.x); -1 unknown
    clip_skip: int  # which layer's output the conditioning comes from


@dataclass(frozen=True)
class Segment:
    """Cached data of consecutive positions (read-only arrays)."""

    kv: np.ndarray  # [L, 2, n, D]
    hidden: np.ndarray  # [n, D] output rows
    final: np.ndarray | None  # [n, D] final-layer-norm rows, None when equal to ``hidden``

    @property
    def length(self) -> int:
        return int(self.hidden.shape[0])


@dataclass(frozen=True)
class PrefixMatch:
    """Longest cached prefix of a token sequence: positions ``0..length-1``."""

    key: CacheKey
    length: int
    segments: tuple[Segment, ...]

    def kv_into(self, out: np.ndarray) -> None:
        """Write the keys/values into ``out`` [L, 2, >= length, D] at positions 0..length-1."""
        start = 0
        for seg in self.segments:
            out[:, :, start : start + seg.length] = seg.kv
            start += seg.length

    def hidden_into(self, out: np.ndarray) -> None:
        """Write the output hidden rows into ``out[:length]``."""
        start = 0
        for seg in self.segments:
            out[start : start + seg.length] = seg.hidden
            start += seg.length

    def final_row(self, position: int) -> np.ndarray:
        """Final-layer-norm row at ``position`` (< length): where a cached pooled output lives."""
        start = 0
        for seg in self.segments:
            if position < start + seg.length:
                rows = seg.hidden if seg.final is None else seg.final
                return rows[position - start]
            start += seg.length
        raise IndexError(f"position {position} is not in a match of length {self.length}")


@dataclass(frozen=True)
class ExactHit:
    """Stored conditioning of a full prompt seen before."""

    hidden: np.ndarray  # [T, D]
    pooled: np.ndarray  # [D]


@dataclass(frozen=True)
class InsertResult:
    """What an insert did: ``added_tokens`` new positions stored (0 when present or refused)."""

    added_tokens: int
    reason: str  # "inserted", "present", "disabled", "prefix-missing", "over-budget"


class _Node:
    __slots__ = ("children", "final", "hidden", "kv", "nbytes", "parent", "pins", "tokens")

    def __init__(self, tokens, kv, hidden, final, parent):
        self.tokens = tokens
        self.kv = kv
        self.hidden = hidden
        self.final = final
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.pins = 0
        self.nbytes = (
            tokens.nbytes + kv.nbytes + hidden.nbytes + (0 if final is None else final.nbytes)
        )

    def segment(self, length: int | None = None) -> Segment:
        if length is None or length == len(self.tokens):
            return Segment(self.kv, self.hidden, self.final)
        final = None if self.final is None else self.final[:length]
        return Segment(self.kv[:, :, :length], self.hidden[:length], final)


class _Exact:
    __slots__ = ("hidden", "lookup", "nbytes", "pooled")

    def __init__(self, lookup, hidden, pooled):
        self.lookup = lookup
        self.hidden = hidden
        self.pooled = pooled
        self.nbytes = len(lookup[1]) + hidden.nbytes + pooled.nbytes


def _common_length(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixKVCache:
    """Radix tree over token ids + exact full-prompt store, one LRU and one byte budget.

    Thread-safe: every public method holds one lock. ``pinned_fraction`` bounds the bytes that
    pinned templates (warm templates, rebuilt templates) may hold.
    """

    def __init__(self, budget_bytes: int, pinned_fraction: float = 0.5):
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        if not (0.0 <= pinned_fraction <= 1.0):
            raise ValueError(f"pinned_fraction must be in [0, 1], got {pinned_fraction}")
        self.budget_bytes = int(budget_bytes)
        self.pinned_fraction = float(pinned_fraction)
        self._lock = threading.Lock()
        self._roots: dict[CacheKey, _Node] = {}
        self._exact: dict[tuple[CacheKey, bytes], _Exact] = {}
        self._lru: OrderedDict[object, None] = OrderedDict()
        self._pinned: list[tuple[CacheKey, np.ndarray]] = []
        self._bytes = 0
        self.evictions = 0  # cumulative number of evicted nodes and exact entries

    # ----------------------------------------------------------------- properties
    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    @property
    def bytes_used(self) -> int:
        return self._bytes

    def pinned_bytes(self) -> int:
        with self._lock:
            return self._pinned_bytes()

    def __len__(self) -> int:
        """Number of stored items (tree nodes and exact entries)."""
        return len(self._lru)

    # ------------------------------------------------------------------- lookups
    def match_prefix(
        self, key: CacheKey, tokens: np.ndarray, limit: int | None = None, touch: bool = True
    ) -> PrefixMatch:
        """Longest stored prefix of ``tokens[:limit]``; refreshes recency of its path."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if limit is not None:
            tokens = tokens[:limit]
        with self._lock:
            root = self._roots.get(key)
            if root is None or not self.enabled:
                return PrefixMatch(key, 0, ())
            node, pos, segments, path = root, 0, [], []
            while pos < len(tokens):
                child = node.children.get(int(tokens[pos]))
                if child is None:
                    break
                common = _common_length(child.tokens, tokens[pos:])
                segments.append(child.segment(common))
                path.append(child)
                pos += common
                if common < len(child.tokens):
                    break
                node = child
            if touch:
                self._touch(path)
            return PrefixMatch(key, pos, tuple(segments))

    def get_exact(self, key: CacheKey, ids: np.ndarray) -> ExactHit | None:
        """Stored conditioning of exactly ``ids`` under ``key``, or None."""
        if not self.enabled:
            return None
        lookup = (key, np.ascontiguousarray(ids, dtype=np.int64).tobytes())
        with self._lock:
            entry = self._exact.get(lookup)
            if entry is None:
                return None
            self._lru.move_to_end(entry)
            return ExactHit(entry.hidden, entry.pooled)

    # ------------------------------------------------------------------- inserts
    def insert_prefix(
        self,
        key: CacheKey,
        tokens: np.ndarray,
        start: int,
        kv: np.ndarray,
        hidden: np.ndarray,
        final: np.ndarray | None = None,
    ) -> InsertResult:
        """Store positions ``start..len(tokens)-1`` of the path ``tokens``.

        ``kv`` [L, 2, n - start, D], ``hidden`` / ``final`` [n - start, D] hold the data of those
        positions (copied; the caller's buffers are not kept). Positions before ``start`` must
        already be in the tree (they were the caller's match); if another thread evicted them
        meanwhile, nothing is inserted (``"prefix-missing"``).
        """
        tokens = np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        if kv.shape[2] != n - start or hidden.shape[0] != n - start:
            raise ValueError(
                f"insert_prefix: arrays cover {kv.shape[2]} positions, expected {n - start}"
            )
        if not self.enabled:
            return InsertResult(0, "disabled")
        if n == 0:
            return InsertResult(0, "present")
        with self._lock:
            root = self._roots.get(key)
            if root is None:
                root = self._roots[key] = _Node(
                    np.zeros(0, np.int64), kv[:, :, :0].copy(), hidden[:0].copy(), None, None
                )
            node, pos, path = root, 0, []
            while pos < n:
                child = node.children.get(int(tokens[pos]))
                if child is None:
                    break
                common = _common_length(child.tokens, tokens[pos:])
                if common < len(child.tokens):
                    child = self._split(child, common)
                path.append(child)
                pos += common
                node = child
            if pos >= n:
                self._touch(path)
                return InsertResult(0, "present")
            if pos < start:
                return InsertResult(0, "prefix-missing")
            off = pos - start
            leaf = _Node(
                tokens[pos:].copy(),
                np.ascontiguousarray(kv[:, :, off:]).copy(),
                hidden[off:].copy(),
                None if final is None else final[off:].copy(),
                node,
            )
            for item in path:  # keep the path alive while making room
                item.pins += 1
            try:
                fits = self._make_room(leaf.nbytes)
            finally:
                for item in path:
                    item.pins -= 1
            if not fits:
                return InsertResult(0, "over-budget")
            node.children[int(tokens[pos])] = leaf
            self._bytes += leaf.nbytes
            self._lru[leaf] = None
            self._touch([*path, leaf])
            return InsertResult(n - pos, "inserted")

    def put_exact(
        self, key: CacheKey, ids: np.ndarray, hidden: np.ndarray, pooled: np.ndarray
    ) -> bool:
        """Store the conditioning of the full prompt ``ids``; False when present or refused."""
        if not self.enabled:
            return False
        lookup = (key, np.ascontiguousarray(ids, dtype=np.int64).tobytes())
        with self._lock:
            entry = self._exact.get(lookup)
            if entry is not None:
                self._lru.move_to_end(entry)
                return False
            entry = _Exact(lookup, hidden.copy(), pooled.copy())
            if not self._make_room(entry.nbytes):
                return False
            self._exact[lookup] = entry
            self._lru[entry] = None
            self._bytes += entry.nbytes
            return True

    # ---------------------------------------------------------------------- pins
    def pin(self, key: CacheKey, tokens: np.ndarray) -> bool:
        """Protect the stored path ``tokens`` from eviction (False: absent or over the pinned
        budget). Pinning the same path twice is a no-op that returns True."""
        tokens = np.asarray(tokens, dtype=np.int64)
        with self._lock:
            if any(k == key and np.array_equal(t, tokens) for k, t in self._pinned):
                return True
            path = self._path_to(key, tokens, split=True)
            if path is None:
                return False
            extra = sum(node.nbytes for node in path if node.pins == 0)
            if self._pinned_bytes() + extra > self.pinned_fraction * self.budget_bytes:
                return False
            for node in path:
                node.pins += 1
            self._pinned.append((key, tokens.copy()))
            return True

    def unpin_all(self) -> None:
        """Make every pinned template evictable again."""
        with self._lock:
            for key, tokens in self._pinned:
                for node in self._path_to(key, tokens, split=False) or ():
                    node.pins -= 1
            self._pinned.clear()

    def pinned_templates(self) -> list[tuple[CacheKey, tuple[int, ...]]]:
        with self._lock:
            return [(k, tuple(int(t) for t in tokens)) for k, tokens in self._pinned]

    def clear(self) -> None:
        """Drop everything (pins included); counters are kept."""
        with self._lock:
            self._roots.clear()
            self._exact.clear()
            self._lru.clear()
            self._pinned.clear()
            self._bytes = 0

    # ------------------------------------------------------------------ internals
    def _touch(self, path: list[_Node]) -> None:
        for node in reversed(path):  # leaf first: ancestors end up more recent (invariant 6)
            self._lru.move_to_end(node)

    def _pinned_bytes(self) -> int:
        return sum(item.nbytes for item in self._lru if isinstance(item, _Node) and item.pins)

    def _path_to(self, key: CacheKey, tokens: np.ndarray, split: bool) -> list[_Node] | None:
        """Nodes covering exactly ``tokens`` (splitting the last one if ``split``), or None."""
        node = self._roots.get(key)
        if node is None or len(tokens) == 0:
            return None
        pos, path = 0, []
        while pos < len(tokens):
            child = node.children.get(int(tokens[pos]))
            if child is None:
                return None
            common = _common_length(child.tokens, tokens[pos:])
            if common < len(child.tokens):
                if pos + common < len(tokens) or not split:
                    return None
                child = self._split(child, common)
            path.append(child)
            pos += common
            node = child
        return path

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut ``node`` after ``at`` tokens; return the new upper node (the lower keeps its
        children, pins and LRU place; the upper becomes most recent, invariant 6)."""
        parent = node.parent
        upper = _Node(
            node.tokens[:at].copy(),
            np.ascontiguousarray(node.kv[:, :, :at]).copy(),
            node.hidden[:at].copy(),
            None if node.final is None else node.final[:at].copy(),
            parent,
        )
        old = node.nbytes
        node.tokens = node.tokens[at:].copy()
        node.kv = np.ascontiguousarray(node.kv[:, :, at:]).copy()
        node.hidden = node.hidden[at:].copy()
        node.final = None if node.final is None else node.final[at:].copy()
        node.nbytes = (
            node.tokens.nbytes
            + node.kv.nbytes
            + node.hidden.nbytes
            + (0 if node.final is None else node.final.nbytes)
        )
        upper.pins = node.pins
        upper.children[int(node.tokens[0])] = node
        node.parent = upper
        parent.children[int(upper.tokens[0])] = upper
        self._bytes += upper.nbytes + node.nbytes - old
        self._lru[upper] = None
        ancestor = parent
        while ancestor.parent is not None:  # the root has no parent and is not in the LRU
            self._lru.move_to_end(ancestor)
            ancestor = ancestor.parent
        return upper

    def _evictable(self, item) -> bool:
        return isinstance(item, _Exact) or (not item.children and item.pins == 0)

    def _make_room(self, size: int) -> bool:
        if size > self.budget_bytes:
            return False
        while self._bytes + size > self.budget_bytes:
            victim = next((item for item in self._lru if self._evictable(item)), None)
            if victim is None:
                return False
            self._evict(victim)
        return True

    def _evict(self, item) -> None:
        del self._lru[item]
        self._bytes -= item.nbytes
        self.evictions += 1
        if isinstance(item, _Exact):
            del self._exact[item.lookup]
            return
        parent = item.parent
        del parent.children[int(item.tokens[0])]
        item.parent = None

    # ---------------------------------------------------------------- invariants
    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant (used by the tests)."""
        with self._lock:
            total, seen = 0, set()
            order = {item: rank for rank, item in enumerate(self._lru)}
            pins_expected: dict[_Node, int] = {}
            for key, tokens in self._pinned:
                for node in self._path_to(key, tokens, split=False) or ():
                    pins_expected[node] = pins_expected.get(node, 0) + 1
            for root in self._roots.values():
                stack = list(root.children.values())
                while stack:
                    node = stack.pop()
                    _check(node in order, "every node is in the LRU")
                    _check(node.parent.children.get(int(node.tokens[0])) is node, "parent link")
                    n = len(node.tokens)
                    _check(n > 0 and node.kv.shape[2] == n == node.hidden.shape[0], "shapes")
                    _check(node.pins == pins_expected.get(node, 0), "pins count templates")
                    for child in node.children.values():
                        _check(order[child] < order[node], "parent more recent than child")
                    total += node.nbytes
                    seen.add(node)
                    stack.extend(node.children.values())
            for entry in self._exact.values():
                _check(entry in order, "every exact entry is in the LRU")
                total += entry.nbytes
                seen.add(entry)
            _check(len(seen) == len(self._lru), "LRU holds only live items")
            _check(total == self._bytes, f"bytes_used {self._bytes} == sum of items {total}")
            _check(self._bytes <= self.budget_bytes, "bytes within budget")
            pinned = self._pinned_bytes()
            _check(pinned <= self.pinned_fraction * self.budget_bytes, "pinned within budget")


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"PrefixKVCache invariant broken: {what}")
