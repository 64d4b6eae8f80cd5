"""The cached CLIP text encoder that the ``text_encoder`` Triton model serves (numpy + ORT).

``CachedTextEncoder.encode(ids [B, 77])`` returns the conditioning of a full forward,
bit-for-bit the same graph arithmetic up to fp32 rounding (<= 1e-5, tested), while running the
encoder only on what the cache does not hold:

1. **exact repeat** (same ids, same key): the stored hidden states and pooled output are
   returned; no graph runs. ``hit_tokens`` = 77.
2. **prefix hit** (the longest cached prefix has ``P >= min_prefix_tokens`` tokens): the suffix
   graph computes positions ``P..76`` attending to the cached keys/values; rows 0..P-1 of the
   output come from the cache. ``hit_tokens`` = P.
3. **miss**: the prefix graph computes all 77 positions. ``hit_tokens`` = 0.

After 2 and 3 the keys/values of the positions before the first eos are inserted into the radix
tree (padding positions depend on the whole prompt and are only kept in the exact entry), and
the full result is stored as an exact entry. Rows of one batch with the same ``P`` share one
graph run.

Health: every call reports to a :class:`~facefuse.cache.health.MetricsSink`; when the hit rate
over the last ``window`` prompts falls below ``hit_rate_threshold``, the cache is cleared and
rebuilt from the most frequent recent prefixes, pinned as templates (warm templates from the
config are pinned the same way at start-up).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from facefuse.cache.health import HitRateWindow, MetricsSink, NullMetrics, PrefixFrequency
from facefuse.cache.radix import CacheKey, PrefixKVCache, PrefixMatch
from facefuse.cache.runtime import KvRuntime, StepOutput
from facefuse.core import metrics as names
from facefuse.core.contract import INPUT_IDS
from facefuse.core.errors import InvalidInput, ModelLoadError

FIELD = INPUT_IDS.name
DEFAULT_BUDGET_BYTES = 256 * 1024 * 1024
PARAMETER_PREFIX = "cache_"


def pooled_index(input_ids: np.ndarray, rule: str, eos_token_id: int) -> np.ndarray:
    """Row-wise position of the pooled output, exactly as transformers' ``CLIPTextModel``:
    the first eos (``"first_eos"``), or the first highest id for legacy configs (``"argmax"``).
    SD 1.x pads with eos (49407) and SD 2.x with 0: both rules pick the first eos then."""
    if rule == "argmax":
        return np.argmax(input_ids.astype(np.int32), axis=-1)
    return np.argmax((input_ids == eos_token_id).astype(np.int32), axis=-1)


@dataclass(frozen=True)
class CacheConfig:
    """Settings of the prefix cache; in Triton, ``parameters`` keys ``cache_<field>``.

    budget_bytes: bytes the cache may hold (tree + exact entries); 0 turns the cache off.
    min_prefix_tokens: shortest cached prefix worth a suffix run (BOS alone is always shared).
    pinned_fraction: share of the budget that pinned templates may hold.
    hit_rate_threshold: rebuild when the window hit rate falls below it; 0 disables rebuilds.
    window: prompts in the sliding window (hit rate and recent-prefix frequency).
    max_templates: templates kept by a rebuild.
    pad_token_id: padding convention of the warm templates' namespace; None = eos (SD 1.x).
    warm_templates: token-id prefixes (BOS added when missing) loaded and pinned at start-up.
    intra_op_threads: ONNX Runtime threads per graph run; 0 lets ONNX Runtime choose.
    """

    budget_bytes: int = DEFAULT_BUDGET_BYTES
    min_prefix_tokens: int = 8
    pinned_fraction: float = 0.5
    hit_rate_threshold: float = 0.0
    window: int = 200
    max_templates: int = 16
    pad_token_id: int | None = None
    warm_templates: tuple[tuple[int, ...], ...] = field(default_factory=tuple)
    intra_op_threads: int = 0

    def __post_init__(self) -> None:
        if self.budget_bytes < 0:
            raise ValueError(f"cache budget_bytes must be >= 0, got {self.budget_bytes}")
        if self.min_prefix_tokens < 1:
            raise ValueError(f"cache min_prefix_tokens must be >= 1, got {self.min_prefix_tokens}")
        if not (0.0 <= self.pinned_fraction <= 1.0):
            raise ValueError(f"cache pinned_fraction must be in [0, 1], got {self.pinned_fraction}")
        if not (0.0 <= self.hit_rate_threshold <= 1.0):
            raise ValueError(
                f"cache hit_rate_threshold must be in [0, 1], got {self.hit_rate_threshold}"
            )
        if self.window < 1 or self.max_templates < 0 or self.intra_op_threads < 0:
            raise ValueError("cache window must be >= 1, max_templates and threads >= 0")
        object.__setattr__(
            self, "warm_templates", tuple(tuple(int(t) for t in tpl) for tpl in self.warm_templates)
        )

    @classmethod
    def from_parameters(
        cls,
        parameters: Mapping[str, str],
        tokenize: Callable[[str], Sequence[int]] | None = None,
    ) -> CacheConfig:
        """Build from Triton ``parameters`` (string values); keys without the ``cache_`` prefix
        belong to other code and are ignored, unknown ``cache_*`` keys are refused.

        ``cache_warm_templates`` is a JSON list whose items are token-id lists or texts
        (texts need ``tokenize``, which returns the ids without bos/eos).
        """
        known = {f for f in cls.__dataclass_fields__}
        values: dict[str, object] = {}
        for key, raw in parameters.items():
            if not key.startswith(PARAMETER_PREFIX):
                continue
            name = key[len(PARAMETER_PREFIX) :]
            if name not in known:
                raise ValueError(
                    f"unknown parameter {key!r}; known: "
                    + ", ".join(sorted(PARAMETER_PREFIX + k for k in known))
                )
            values[name] = _parse_parameter(name, str(raw), tokenize)
        return cls(**values)


def _parse_parameter(name: str, raw: str, tokenize) -> object:
    raw = raw.strip()
    if name in ("hit_rate_threshold", "pinned_fraction"):
        return float(raw)
    if name == "pad_token_id":
        return None if raw.lower() in ("", "none", "eos") else int(raw)
    if name == "warm_templates":
        items = json.loads(raw) if raw else []
        if not isinstance(items, list):
            raise ValueError("cache_warm_templates must be a JSON list")
        templates = []
        for item in items:
            if isinstance(item, str):
                if tokenize is None:
                    raise ValueError("cache_warm_templates has texts but no tokenizer was given")
                templates.append(tuple(int(t) for t in tokenize(item)))
            else:
                templates.append(tuple(int(t) for t in item))
        return tuple(templates)
    return int(raw)


class EncodeResult(NamedTuple):
    hidden: np.ndarray  # [B, 77, D] fp32
    pooled: np.ndarray  # [B, D] fp32
    hit_tokens: np.ndarray  # [B] int32: 77 exact repeat, P prefix hit, 0 miss


class _Row(NamedTuple):
    index: int
    key: CacheKey
    cacheable: int  # positions before the first eos (at most max_length - 1)
    match: PrefixMatch


class CachedTextEncoder:
    """Exact prefix-KV cached CLIP text encoder over the exported KV graphs in ``onnx_dir``."""

    def __init__(
        self,
        onnx_dir: str | Path,
        config: CacheConfig | None = None,
        metrics: MetricsSink | None = None,
        runtime: KvRuntime | None = None,
    ):
        self.config = config or CacheConfig()
        self.runtime = runtime or KvRuntime(onnx_dir, self.config.intra_op_threads)
        manifest = self.runtime.manifest
        self.manifest = manifest
        self.max_length = manifest.max_length
        self.metrics = metrics or NullMetrics()
        self.cache = PrefixKVCache(self.config.budget_bytes, self.config.pinned_fraction)
        pad = self.config.pad_token_id
        self.default_pad = manifest.eos_token_id if pad is None else int(pad)
        self.default_key = CacheKey(manifest.model_id, self.default_pad, manifest.clip_skip)
        self._window = HitRateWindow(self.config.window)
        self._frequency = PrefixFrequency(self.config.window)
        self._since_rebuild = 0
        self._state_lock = threading.Lock()
        self._rebuild_lock = threading.Lock()
        self._evictions_reported = 0
        self.metrics.set(names.PREFIX_CACHE_BYTES, 0)
        self.metrics.set(names.PREFIX_CACHE_HIT_RATE, 0)
        if self.config.warm_templates and self.cache.enabled:
            loaded = self.load_templates(self.config.warm_templates)
            if len(loaded) != len(self.config.warm_templates):
                raise ModelLoadError(
                    f"text_encoder: {len(self.config.warm_templates) - len(loaded)} warm "
                    f"template(s) do not fit in the pinned budget "
                    f"({self.config.pinned_fraction:.0%} of {self.config.budget_bytes} bytes)"
                )

    # ------------------------------------------------------------------ checks
    def check_ids(self, input_ids) -> np.ndarray:
        """Return ``input_ids`` as int64 [B, 77]; InvalidInput("INPUT_IDS", ...) otherwise."""
        ids = np.asarray(input_ids)
        if ids.dtype.kind not in "iu":
            raise InvalidInput(FIELD, f"must be integer token ids, got dtype {ids.dtype}")
        if ids.ndim != 2 or ids.shape[0] < 1 or ids.shape[1] != self.max_length:
            raise InvalidInput(
                FIELD, f"must have shape [batch, {self.max_length}], got {list(ids.shape)}"
            )
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= self.manifest.vocab_size:
            bad = low if low < 0 else high
            raise InvalidInput(
                FIELD, f"token ids must be in 0..{self.manifest.vocab_size - 1}, got {bad}"
            )
        return np.ascontiguousarray(ids, dtype=np.int64)

    def key_of(self, row: np.ndarray) -> CacheKey:
        """Namespace of a prompt: the padding convention is read after the first eos."""
        eos = np.flatnonzero(row == self.manifest.eos_token_id)
        pad = self.default_pad
        if len(eos) and eos[0] + 1 < len(row):
            pad = int(row[eos[0] + 1])
        if pad == self.default_pad:
            return self.default_key
        return CacheKey(self.manifest.model_id, pad, self.manifest.clip_skip)

    def cacheable_length(self, row: np.ndarray) -> int:
        """Positions before the first eos (the part later prompts can share), < 77."""
        eos = np.flatnonzero(row == self.manifest.eos_token_id)
        end = int(eos[0]) if len(eos) else len(row)
        return min(end, len(row) - 1)

    # ------------------------------------------------------------------ encode
    def encode(self, input_ids) -> EncodeResult:
        """Conditioning of ``input_ids`` [B, 77]: (hidden [B, 77, D], pooled [B, D], hit [B])."""
        ids = self.check_ids(input_ids)
        batch, dim, length = ids.shape[0], self.manifest.hidden_size, self.max_length
        hidden = np.empty((batch, length, dim), dtype=np.float32)
        pooled = np.empty((batch, dim), dtype=np.float32)
        hit_tokens = np.zeros(batch, dtype=np.int32)
        pool_at = pooled_index(ids, self.manifest.pooled_rule, self.manifest.eos_token_id)
        enabled = self.cache.enabled

        groups: dict[int, list[_Row]] = {}
        full_hits = 0
        for index in range(batch):
            row = ids[index]
            key = self.key_of(row)
            cacheable = self.cacheable_length(row)
            if enabled:
                exact = self.cache.get_exact(key, row)
                if exact is not None:
                    hidden[index] = exact.hidden
                    pooled[index] = exact.pooled
                    hit_tokens[index] = length
                    full_hits += 1
                    continue
                match = self.cache.match_prefix(key, row, limit=cacheable)
                if match.length < self.config.min_prefix_tokens:
                    match = PrefixMatch(key, 0, ())
            else:
                match = PrefixMatch(key, 0, ())
            groups.setdefault(match.length, []).append(_Row(index, key, cacheable, match))

        for past, rows in groups.items():
            out = self._run(ids, past, rows)
            for slot, info in enumerate(rows):
                self._assemble(info, slot, past, out, hidden, pooled, pool_at)
                hit_tokens[info.index] = past
                if enabled:
                    self._store(ids[info.index], info, slot, past, out, hidden, pooled)

        self._report(ids, hit_tokens, full_hits)
        return EncodeResult(hidden, pooled, hit_tokens)

    def _run(self, ids: np.ndarray, past: int, rows: list[_Row]) -> StepOutput:
        picked = ids[[info.index for info in rows]]
        if past == 0:
            return self.runtime.prefix(picked)
        manifest = self.manifest
        segments = rows[0].match.segments
        if len(rows) == 1 and len(segments) == 1 and segments[0].kv.flags.c_contiguous:
            # The whole prefix is one stored node: hand its (read-only) array over, no copy.
            return self.runtime.suffix(picked[:, past:], segments[0].kv[None])
        past_kv = np.empty(
            (len(rows), manifest.num_layers, 2, past, manifest.hidden_size), dtype=np.float32
        )
        for slot, info in enumerate(rows):
            info.match.kv_into(past_kv[slot])
        return self.runtime.suffix(np.ascontiguousarray(picked[:, past:]), past_kv)

    @staticmethod
    def _assemble(info, slot, past, out: StepOutput, hidden, pooled, pool_at) -> None:
        index = info.index
        if past:
            info.match.hidden_into(hidden[index])
        hidden[index, past:] = out.hidden[slot]
        at = int(pool_at[index])
        # The pooled row lies in the cached prefix only when no eos follows it (or under the
        # legacy argmax rule); it then comes from the cache's final-layer-norm rows.
        pooled[index] = info.match.final_row(at) if at < past else out.final[slot, at - past]

    def _store(self, row, info: _Row, slot, past, out: StepOutput, hidden, pooled) -> None:
        stop = info.cacheable - past
        if stop > 0:
            self.cache.insert_prefix(
                info.key,
                row[: info.cacheable],
                past,
                out.kv[slot, :, :, :stop],
                out.hidden[slot, :stop],
                out.final[slot, :stop] if self.manifest.has_final else None,
            )
        self.cache.put_exact(info.key, row, hidden[info.index], pooled[info.index])

    # ------------------------------------------------------------------ health
    def _report(self, ids: np.ndarray, hit_tokens: np.ndarray, full_hits: int) -> None:
        if not self.cache.enabled:
            self.metrics.increment(names.PREFIX_CACHE_REQUESTS, len(ids))
            return
        hits = hit_tokens > 0
        self._window.record(hits.tolist())
        self._frequency.record(ids[i, : self.cacheable_length(ids[i])] for i in range(len(ids)))
        m = self.metrics
        m.increment(names.PREFIX_CACHE_REQUESTS, len(ids))
        m.increment(names.PREFIX_CACHE_HITS, int(hits.sum()))
        m.increment(names.PREFIX_CACHE_FULL_HITS, full_hits)
        m.increment(names.PREFIX_CACHE_HIT_TOKENS, int(hit_tokens.sum()))
        with self._state_lock:
            evictions = self.cache.evictions - self._evictions_reported
            self._evictions_reported = self.cache.evictions
            self._since_rebuild += len(ids)
            due = (
                self.config.hit_rate_threshold > 0
                and self._window.full
                and self._since_rebuild >= self.config.window
                and self._window.rate < self.config.hit_rate_threshold
            )
        m.increment(names.PREFIX_CACHE_EVICTIONS, evictions)
        m.set(names.PREFIX_CACHE_HIT_RATE, self._window.rate)
        m.set(names.PREFIX_CACHE_BYTES, self.cache.bytes_used)
        if due:
            self.rebuild()

    @property
    def hit_rate(self) -> float:
        """Hit rate over the sliding window."""
        return self._window.rate

    def rebuild(self, templates: Sequence[Sequence[int]] | None = None) -> list[tuple[int, ...]]:
        """Clear the cache and load ``templates`` (default: the most frequent recent prefixes)
        as pinned templates. Returns the templates loaded. One rebuild at a time: a call while
        another runs returns [] at once."""
        if not self._rebuild_lock.acquire(blocking=False):
            return []
        try:
            if templates is None:
                templates = self._frequency.top_prefixes(
                    self.config.max_templates, self.config.min_prefix_tokens
                )
            self.cache.clear()
            loaded = self.load_templates(templates) if self.cache.enabled else []
            with self._state_lock:
                self._since_rebuild = 0
                self._window.reset()
            self.metrics.increment(names.PREFIX_CACHE_REBUILDS)
            self.metrics.set(names.PREFIX_CACHE_BYTES, self.cache.bytes_used)
            self.metrics.set(names.PREFIX_CACHE_HIT_RATE, 0)
            return loaded
        finally:
            self._rebuild_lock.release()

    def load_templates(self, templates: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
        """Encode each template prefix (BOS prepended when missing), insert and pin it in the
        default namespace. Templates over the pinned budget are skipped (not returned)."""
        bos = self.manifest.bos_token_id
        prepared: list[np.ndarray] = []
        for template in templates:
            tokens = np.asarray([int(t) for t in template], dtype=np.int64)
            if len(tokens) == 0 or tokens[0] != bos:
                tokens = np.concatenate([[bos], tokens]).astype(np.int64)
            if len(tokens) >= self.max_length:
                raise ValueError(
                    f"template of {len(tokens)} tokens: at most {self.max_length - 1} allowed"
                )
            if (tokens < 0).any() or (tokens >= self.manifest.vocab_size).any():
                raise ValueError("template token ids out of the vocabulary")
            if (tokens == self.manifest.eos_token_id).any():
                raise ValueError("a template is a prefix: it must not contain the eos token")
            prepared.append(tokens)
        loaded = []
        for tokens in prepared:
            key = self.default_key
            match = self.cache.match_prefix(key, tokens)
            if match.length < len(tokens):
                out = self.runtime.prefix(tokens[None, :])
                self.cache.insert_prefix(
                    key,
                    tokens,
                    0,
                    out.kv[0],
                    out.hidden[0],
                    out.final[0] if self.manifest.has_final else None,
                )
            if self.cache.pin(key, tokens):
                loaded.append(tuple(int(t) for t in tokens))
        self.metrics.set(names.PREFIX_CACHE_BYTES, self.cache.bytes_used)
        return loaded
