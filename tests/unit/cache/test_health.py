"""Health pieces of the prefix cache: hit-rate window, template frequency, metric sinks, config."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from facefuse.cache.encoder import CacheConfig
from facefuse.cache.health import (
    CACHE_METRICS,
    HitRateWindow,
    InMemoryMetrics,
    PrefixFrequency,
    TritonMetricsSink,
)
from facefuse.core import metrics as names


def test_hit_rate_window_slides():
    window = HitRateWindow(4)
    assert window.rate == 0.0 and not window.full
    window.record([True, True, False])
    assert window.rate == pytest.approx(2 / 3) and not window.full
    window.record([False, False, False])  # the two hits slide out
    assert window.full and window.rate == 0.0
    window.record([True])
    assert window.rate == pytest.approx(1 / 4)
    window.reset()
    assert window.rate == 0.0 and not window.full
    with pytest.raises(ValueError):
        HitRateWindow(0)


def test_top_prefixes_returns_whole_templates_ranked_by_tokens_saved():
    frequency = PrefixFrequency(100)
    long_template = list(range(1000, 1030))  # 30 tokens
    short_template = list(range(2000, 2010))  # 10 tokens
    prompts = [[*long_template, i, i + 1] for i in range(10)]  # 10 x 30
    prompts += [[*short_template, i] for i in range(20)]  # 20 x 10
    prompts += [[5000 + i] * 12 for i in range(5)]  # unique
    frequency.record(prompts)
    top = frequency.top_prefixes(max_templates=5, min_tokens=8)
    assert top[0] == tuple(long_template)  # 300 tokens saved beats 200
    assert top[1] == tuple(short_template)
    assert all(len(p) >= 8 for p in top)
    # The stems of the long template (shared by the same 10 prompts) are not candidates.
    assert tuple(long_template[:20]) not in top
    assert frequency.top_prefixes(max_templates=1, min_tokens=8) == [tuple(long_template)]
    assert frequency.top_prefixes(max_templates=5, min_tokens=8, min_support=11) == [
        tuple(short_template)
    ]


def test_prefix_frequency_forgets_old_prompts():
    frequency = PrefixFrequency(5)
    frequency.record([list(range(10))] * 5)
    frequency.record([[*range(50, 60), i] for i in range(5)])
    assert len(frequency) == 5
    assert frequency.top_prefixes(3, min_tokens=4) == [tuple(range(50, 60))]


def test_in_memory_metrics():
    sink = InMemoryMetrics()
    sink.increment("a")
    sink.increment("a", 2)
    sink.set("g", 3)
    sink.set("g", 1)
    assert sink.counters == {"a": 3.0} and sink.gauges == {"g": 1.0}
    with pytest.raises(ValueError):
        sink.increment("a", -1)


def fake_pb_utils():
    created = {}

    class Metric:
        def __init__(self, labels):
            self.labels = labels
            self.value = 0.0

        def increment(self, value):
            self.value += value

        def set(self, value):
            self.value = value

    class MetricFamily:
        COUNTER = "counter"
        GAUGE = "gauge"

        def __init__(self, name, description, kind):
            self.name, self.description, self.kind = name, description, kind
            self.metrics = []
            created[name] = self

        def Metric(self, labels):
            metric = Metric(labels)
            self.metrics.append(metric)
            return metric

    return SimpleNamespace(MetricFamily=MetricFamily), created


def test_triton_sink_maps_every_cache_metric():
    pb_utils, created = fake_pb_utils()
    sink = TritonMetricsSink(pb_utils, labels={"model": "text_encoder"})
    assert set(created) == set(CACHE_METRICS)
    assert set(CACHE_METRICS) <= set(names.CUSTOM_METRICS)
    assert created[names.PREFIX_CACHE_BYTES].kind == "gauge"
    assert created[names.PREFIX_CACHE_HITS].kind == "counter"
    sink.increment(names.PREFIX_CACHE_HITS, 3)
    sink.increment(names.PREFIX_CACHE_HITS, 0)
    sink.set(names.PREFIX_CACHE_BYTES, 1234)
    assert created[names.PREFIX_CACHE_HITS].metrics[0].value == 3
    assert created[names.PREFIX_CACHE_BYTES].metrics[0].value == 1234
    assert created[names.PREFIX_CACHE_HITS].metrics[0].labels == {"model": "text_encoder"}


def test_config_from_triton_parameters():
    config = CacheConfig.from_parameters(
        {
            "cache_budget_bytes": "1048576",
            "cache_hit_rate_threshold": "0.3",
            "cache_window": "50",
            "cache_warm_templates": '[[49406, 1, 2], "portrait photo"]',
            "cache_pad_token_id": "0",
            "other_owner_key": "whatever",
        },
        tokenize=lambda text: [7] * len(text.split()),
    )
    assert config.budget_bytes == 1 << 20
    assert config.hit_rate_threshold == 0.3 and config.window == 50
    assert config.warm_templates == ((49406, 1, 2), (7, 7))
    assert config.pad_token_id == 0
    assert CacheConfig.from_parameters({"cache_pad_token_id": "eos"}).pad_token_id is None


@pytest.mark.parametrize(
    "parameters",
    [
        {"cache_budget": "1"},  # unknown cache_ key
        {"cache_budget_bytes": "-1"},
        {"cache_budget_bytes": "lots"},
        {"cache_hit_rate_threshold": "1.5"},
        {"cache_window": "0"},
        {"cache_min_prefix_tokens": "0"},
        {"cache_warm_templates": '{"a": 1}'},
        {"cache_warm_templates": '["text needs a tokenizer"]'},
    ],
)
def test_config_refuses_bad_parameters(parameters):
    with pytest.raises(ValueError):
        CacheConfig.from_parameters(parameters)
