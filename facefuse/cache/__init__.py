"""Exact prefix-KV cache for the CLIP text encoder (numpy + onnxruntime; no torch).

- :mod:`facefuse.cache.radix`: token-id radix tree, LRU under a byte budget, exact entries.
- :mod:`facefuse.cache.runtime`: ONNX Runtime sessions of the exported prefix/suffix graphs.
- :mod:`facefuse.cache.encoder`: :class:`CachedTextEncoder`, what the Triton model calls.
- :mod:`facefuse.cache.health`: metrics sinks, sliding-window hit rate, template frequency.
"""

from facefuse.cache.encoder import CacheConfig, CachedTextEncoder, EncodeResult, pooled_index
from facefuse.cache.health import InMemoryMetrics, MetricsSink, NullMetrics, TritonMetricsSink
from facefuse.cache.radix import CacheKey, PrefixKVCache, PrefixMatch

__all__ = [
    "CacheConfig",
    "CacheKey",
    "CachedTextEncoder",
    "EncodeResult",
    "InMemoryMetrics",
    "MetricsSink",
    "NullMetrics",
    "PrefixKVCache",
    "PrefixMatch",
    "TritonMetricsSink",
    "pooled_index",
]
