"""CachedTextEncoder on the seeded tiny CLIP text encoder exported to ONNX (no server).

Exactness is checked against the PyTorch full forward (transformers' CLIPTextModel) on random
prompts with both padding conventions, clip_skip, prefix hits of many lengths and exact repeats.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from facefuse.cache import CacheConfig, CachedTextEncoder, InMemoryMetrics, pooled_index
from facefuse.core import metrics as names
from facefuse.core.errors import InvalidInput, ModelLoadError

torch = pytest.importorskip("torch")
kv_export = pytest.importorskip("facefuse.export.text_encoder_kv")

BOS, EOS, TOL = 49406, 49407, 1e-5


@pytest.fixture(scope="module")
def model():
    from facefuse.models.tiny import TINY, build_text_encoder

    return build_text_encoder(TINY)


@pytest.fixture(scope="module")
def onnx_dir(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("kv0")
    kv_export.export_kv_encoder(model, out, verbose=False)
    return out


@pytest.fixture(scope="module")
def onnx_dir_skip(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("kv1")
    kv_export.export_kv_encoder(model, out, clip_skip=1, verbose=False)
    return out


@pytest.fixture(scope="module")
def runtimes(onnx_dir):
    """ONNX Runtime sessions shared by the encoders of this module (one per folder)."""
    from facefuse.cache.runtime import KvRuntime

    made = {}

    def get(folder):
        if folder not in made:
            made[folder] = KvRuntime(folder, intra_op_threads=1)
        return made[folder]

    return get


def make_encoder(runtimes, folder, config=None, metrics=None):
    return CachedTextEncoder(folder, config, metrics, runtime=runtimes(folder))


def prompt(content, pad=EOS):
    ids = np.full(77, pad, dtype=np.int64)
    ids[0] = BOS
    ids[1 : 1 + len(content)] = content
    ids[1 + len(content)] = EOS
    return ids


def random_prompts(rng, count, templates, pad_choices=(EOS, 0)):
    rows = []
    for _ in range(count):
        template = templates[int(rng.integers(len(templates)))]
        tail = rng.integers(1, 49000, int(rng.integers(1, 12))).tolist()
        content = (list(template) + tail)[:74]
        rows.append(prompt(content, pad=int(rng.choice(pad_choices))))
    return np.stack(rows)


def assert_exact(model, ids, hidden, pooled, clip_skip=0):
    ref_hidden, ref_pooled = kv_export.reference_outputs(model, ids, clip_skip)
    assert hidden.shape == ref_hidden.shape and hidden.dtype == np.float32
    assert float(np.max(np.abs(hidden - ref_hidden))) <= TOL
    assert float(np.max(np.abs(pooled - ref_pooled))) <= TOL


def test_export_writes_graphs_and_manifest(onnx_dir):
    manifest = json.loads((onnx_dir / kv_export.KV_MANIFEST_FILE).read_text())
    assert manifest["num_layers"] == 4 and manifest["hidden_size"] == 64
    assert manifest["max_abs_diff"] <= TOL and manifest["pooled_rule"] == "first_eos"
    assert manifest["outputs"] == ["kv", "hidden"]
    assert len(manifest["model_id"]) == 64


def test_parity_check_fails_loudly_when_the_bound_is_not_met(model, onnx_dir):
    prefix, suffix = onnx_dir / kv_export.KV_PREFIX_FILE, onnx_dir / kv_export.KV_SUFFIX_FILE
    assert kv_export.check_kv_graphs(model, prefix, suffix) <= TOL
    with pytest.raises(kv_export.KvExportError, match="differ by"):
        kv_export.check_kv_graphs(model, prefix, suffix, tolerance=1e-12)


def test_onnx_graphs_dynamic_batch_prefix_and_suffix(model, onnx_dir):
    from facefuse.cache.runtime import KvRuntime

    runtime = KvRuntime(onnx_dir)
    rng = np.random.default_rng(3)
    ids = random_prompts(rng, 3, [[]])
    ref_hidden, _ = kv_export.reference_outputs(model, ids)
    for split in (1, 7, 40, 76):
        pre = runtime.prefix(ids[:, :split])
        assert pre.kv.shape == (3, 4, 2, split, 64)
        suf = runtime.suffix(ids[:, split:], pre.kv)
        assert suf.kv.shape == (3, 4, 2, 77 - split, 64)
        hidden = np.concatenate([pre.hidden, suf.hidden], axis=1)
        assert float(np.max(np.abs(hidden - ref_hidden))) <= TOL


@pytest.mark.parametrize("clip_skip", [0, 1])
def test_exact_on_random_prompts_both_paddings(model, onnx_dir, onnx_dir_skip, clip_skip, runtimes):
    folder = onnx_dir_skip if clip_skip else onnx_dir
    rng = np.random.default_rng(clip_skip)
    templates = [rng.integers(1, 49000, n).tolist() for n in (5, 15, 30, 47, 63)]
    encoder = make_encoder(
        runtimes, folder, CacheConfig(budget_bytes=64 << 20, min_prefix_tokens=4)
    )
    seen_hits = set()
    for _ in range(3):
        ids = random_prompts(rng, 10, templates)
        hidden, pooled, hits = encoder.encode(ids)
        assert_exact(model, ids, hidden, pooled, clip_skip)
        seen_hits.update(int(h) for h in hits)
        hidden, pooled, hits = encoder.encode(ids)  # exact repeats
        assert (hits == 77).all()
        assert_exact(model, ids, hidden, pooled, clip_skip)
    # prefix hits of several lengths happened, not only misses and repeats
    assert len([h for h in seen_hits if 4 <= h < 77]) >= 3
    encoder.cache.check_invariants()


def test_prefix_hit_length_and_batch_of_mixed_hits(model, onnx_dir, runtimes):
    encoder = make_encoder(
        runtimes, onnx_dir, CacheConfig(budget_bytes=64 << 20, min_prefix_tokens=4)
    )
    template = list(range(300, 330))  # 30 content tokens: BOS + 30 = 31 cached positions
    first = prompt([*template, 1, 2, 3])
    assert encoder.encode(first[None]).hit_tokens.tolist() == [0]
    batch = np.stack(
        [
            prompt([*template, 9, 9]),  # shares BOS + template + nothing: 31
            prompt([*template, 1, 2, 7]),  # shares 33
            prompt([5, 6, 7]),  # miss (only BOS shared)
            first,  # exact repeat
        ]
    )
    hidden, pooled, hits = encoder.encode(batch)
    assert hits.tolist() == [31, 33, 0, 77]
    assert_exact(model, batch, hidden, pooled)


def test_pooled_from_cache_when_no_eos_follows(model, onnx_dir, runtimes):
    """A 77-token chunk without eos pools at position 0 (first_eos rule): inside the prefix."""
    encoder = make_encoder(
        runtimes, onnx_dir, CacheConfig(budget_bytes=64 << 20, min_prefix_tokens=4)
    )
    rng = np.random.default_rng(7)
    a = rng.integers(1, 49000, 77)
    b = a.copy()
    b[60:] = rng.integers(1, 49000, 17)
    encoder.encode(a[None])
    hidden, pooled, hits = encoder.encode(b[None])
    assert hits.tolist() == [60]
    assert_exact(model, b[None], hidden, pooled)


def test_legacy_argmax_pooling_rule(model, onnx_dir, tmp_path, runtimes):
    """Real SD checkpoints carry eos_token_id=2: transformers then pools at argmax(ids). The
    graphs do not depend on the rule (pooling is a numpy gather), only the manifest does."""
    manifest = json.loads((onnx_dir / kv_export.KV_MANIFEST_FILE).read_text())
    manifest["pooled_rule"] = "argmax"
    (tmp_path / kv_export.KV_MANIFEST_FILE).write_text(json.dumps(manifest))
    for name in (kv_export.KV_PREFIX_FILE, kv_export.KV_SUFFIX_FILE):
        (tmp_path / name).symlink_to(onnx_dir / name)
    encoder = make_encoder(
        runtimes, tmp_path, CacheConfig(budget_bytes=64 << 20, min_prefix_tokens=4)
    )
    rng = np.random.default_rng(1)
    base = rng.integers(1, 49000, 77)  # a chunk without eos; its largest id sits at 20
    base[20] = 49405
    other = base.copy()
    other[60:] = rng.integers(1, 49000, 17)
    ids = np.stack([base, other])
    encoder.encode(ids[:1])
    hidden, pooled, hits = encoder.encode(ids)
    assert hits.tolist() == [77, 60]
    model.eos_token_id = 2  # transformers' legacy branch
    try:
        assert kv_export.pooled_rule(model) == "first_eos"  # the config still says 49407
        ref_hidden, ref_pooled = kv_export.reference_outputs(model, ids)
    finally:
        model.eos_token_id = EOS
    assert float(np.max(np.abs(hidden - ref_hidden))) <= TOL
    assert float(np.max(np.abs(pooled - ref_pooled))) <= TOL
    # the rules disagree on this row (20 vs 0), so the check above exercised argmax
    assert pooled_index(ids, "first_eos", EOS).tolist() == [0, 0]
    assert pooled_index(ids, "argmax", EOS).tolist() == [20, 20]


def test_padding_convention_is_part_of_the_key(model, onnx_dir, runtimes):
    encoder = make_encoder(
        runtimes, onnx_dir, CacheConfig(budget_bytes=64 << 20, min_prefix_tokens=4)
    )
    content = list(range(500, 540))
    sd1 = prompt(content, pad=EOS)
    sd2 = prompt(content, pad=0)
    encoder.encode(sd1[None])
    hidden, pooled, hits = encoder.encode(sd2[None])
    assert hits.tolist() == [0]  # neither an exact hit nor a prefix from the other convention
    assert_exact(model, sd2[None], hidden, pooled)
    assert encoder.encode(sd2[None]).hit_tokens.tolist() == [77]


@pytest.mark.parametrize(
    "bad, what",
    [
        (np.full((1, 77), 49408), "0..49407"),
        (np.full((2, 77), -1), "0..49407"),
        (np.zeros((1, 76), dtype=np.int64), "shape"),
        (np.zeros((1, 78), dtype=np.int64), "shape"),
        (np.zeros(77, dtype=np.int64), "shape"),
        (np.zeros((0, 77), dtype=np.int64), "shape"),
        (np.zeros((1, 77), dtype=np.float32), "integer"),
    ],
)
def test_bad_ids_are_invalid_input(onnx_dir, bad, what, runtimes):
    encoder = make_encoder(runtimes, onnx_dir, CacheConfig(budget_bytes=1 << 20))
    with pytest.raises(InvalidInput, match=what) as info:
        encoder.encode(bad)
    assert info.value.field == "INPUT_IDS"
    assert encoder.cache.bytes_used == 0


def test_budget_zero_is_a_clean_no_op(model, onnx_dir, runtimes):
    sink = InMemoryMetrics()
    config = CacheConfig(
        budget_bytes=0, warm_templates=[[1, 2, 3]], hit_rate_threshold=0.9, window=2
    )
    encoder = make_encoder(runtimes, onnx_dir, config, sink)
    ids = random_prompts(np.random.default_rng(0), 4, [list(range(100, 120))])
    for _ in range(3):
        hidden, pooled, hits = encoder.encode(ids)
        assert (hits == 0).all()
        assert_exact(model, ids, hidden, pooled)
    assert encoder.cache.bytes_used == 0 and len(encoder.cache) == 0
    assert sink.counters.get(names.PREFIX_CACHE_HITS, 0) == 0
    assert sink.counters.get(names.PREFIX_CACHE_REBUILDS, 0) == 0
    assert sink.counters[names.PREFIX_CACHE_REQUESTS] == 12


def test_warm_templates_are_loaded_pinned_and_hit(model, onnx_dir, runtimes):
    template = list(range(700, 720))
    sink = InMemoryMetrics()
    config = CacheConfig(budget_bytes=8 << 20, warm_templates=[template], min_prefix_tokens=4)
    encoder = make_encoder(runtimes, onnx_dir, config, sink)
    assert sink.gauges[names.PREFIX_CACHE_BYTES] > 0
    ids = prompt([*template, 5, 6])[None]
    hidden, pooled, hits = encoder.encode(ids)
    assert hits.tolist() == [21]  # BOS + 20 template tokens, on the very first request
    assert_exact(model, ids, hidden, pooled)
    assert encoder.cache.pinned_templates()[0][1] == (BOS, *template)


def test_warm_templates_over_the_pinned_budget_fail_at_load(onnx_dir, runtimes):
    config = CacheConfig(budget_bytes=20_000, warm_templates=[list(range(100, 150))])
    with pytest.raises(ModelLoadError, match="pinned budget"):
        make_encoder(runtimes, onnx_dir, config)


def test_metrics_after_known_traffic(onnx_dir, runtimes):
    sink = InMemoryMetrics()
    encoder = make_encoder(
        runtimes, onnx_dir, CacheConfig(budget_bytes=8 << 20, min_prefix_tokens=4), sink
    )
    template = list(range(900, 920))
    encoder.encode(prompt([*template, 1])[None])  # miss
    encoder.encode(prompt([*template, 2])[None])  # prefix hit of 21
    encoder.encode(prompt([*template, 2])[None])  # exact repeat
    c = sink.counters
    assert c[names.PREFIX_CACHE_REQUESTS] == 3
    assert c[names.PREFIX_CACHE_HITS] == 2
    assert c[names.PREFIX_CACHE_FULL_HITS] == 1
    assert c[names.PREFIX_CACHE_HIT_TOKENS] == 21 + 77
    assert sink.gauges[names.PREFIX_CACHE_BYTES] == encoder.cache.bytes_used > 0
    assert sink.gauges[names.PREFIX_CACHE_HIT_RATE] == pytest.approx(2 / 3)


def test_evictions_are_counted_and_budget_holds(model, onnx_dir, runtimes):
    sink = InMemoryMetrics()
    budget = 200_000
    encoder = make_encoder(runtimes, onnx_dir, CacheConfig(budget_bytes=budget), sink)
    rng = np.random.default_rng(11)
    for _ in range(6):
        ids = random_prompts(rng, 8, [[]])
        encoder.encode(ids)
        assert encoder.cache.bytes_used <= budget
    assert sink.counters[names.PREFIX_CACHE_EVICTIONS] == encoder.cache.evictions > 0
    encoder.cache.check_invariants()


def test_concurrent_requests_with_the_same_new_prefix(model, onnx_dir, runtimes):
    encoder = make_encoder(
        runtimes, onnx_dir, CacheConfig(budget_bytes=64 << 20, min_prefix_tokens=4)
    )
    template = list(range(1200, 1240))
    ids = np.stack([prompt([*template, t]) for t in (1, 2, 3)])
    threads, results, errors = 6, [], []
    barrier = threading.Barrier(threads)

    def worker():
        try:
            barrier.wait()
            results.append(encoder.encode(ids))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert not errors
    for hidden, pooled, _ in results:
        assert_exact(model, ids, hidden, pooled)
    encoder.cache.check_invariants()
    single = make_encoder(
        runtimes, onnx_dir, CacheConfig(budget_bytes=64 << 20, min_prefix_tokens=4)
    )
    single.encode(ids)
    assert encoder.cache.bytes_used == single.cache.bytes_used  # each path stored once
    assert len(encoder.cache) == len(single.cache)


def test_rebuild_when_hit_rate_drops(model, onnx_dir, runtimes):
    """Traffic moves from warm template A to template B while the dynamic part of the budget is
    too small to keep B's prompts: the window hit rate falls, the cache rebuilds from recent
    traffic, pins B (dropping stale A) and the hits come back."""
    rng = np.random.default_rng(5)
    a = rng.integers(1, 49000, 29).tolist()
    b = rng.integers(1, 49000, 29).tolist()
    sink = InMemoryMetrics()
    per_token = 4 * 2 * 64 * 4 + 64 * 4 + 8  # K/V of 4 layers + hidden row + token id
    budget = 2 * 32 * per_token  # pinned half holds one 30-token template, not a 40-token prompt
    config = CacheConfig(
        budget_bytes=budget,
        warm_templates=[a],
        hit_rate_threshold=0.5,
        window=10,
        min_prefix_tokens=8,
    )
    encoder = make_encoder(runtimes, onnx_dir, config, sink)
    assert encoder.encode(prompt([*a, 1, 2])[None]).hit_tokens.tolist() == [30]
    before = []
    while not sink.counters.get(names.PREFIX_CACHE_REBUILDS):
        ids = prompt([*b, *rng.integers(1, 49000, 10).tolist()])[None]
        before.append(int(encoder.encode(ids).hit_tokens[0]))
    # The window (A's hit + 9 misses on B) filled at 10% < 50%: rebuilt once, right then.
    assert len(before) == 9 and max(before) == 0  # B prompts never stayed in the cache
    pinned = [tokens for _, tokens in encoder.cache.pinned_templates()]
    assert pinned == [(BOS, *b)]  # B pinned; A, stale, dropped
    after_ids = np.stack([prompt([*b, *rng.integers(1, 49000, 10).tolist()]) for _ in range(5)])
    hidden, pooled, hits = encoder.encode(after_ids)
    assert (hits == 30).all()
    assert sink.counters[names.PREFIX_CACHE_REBUILDS] == 1
    assert_exact(model, after_ids, hidden, pooled)
    assert encoder.encode(prompt([*a, 3, 4])[None]).hit_tokens.tolist() == [0]
    encoder.cache.check_invariants()


def test_no_rebuild_while_hit_rate_is_healthy(onnx_dir, runtimes):
    sink = InMemoryMetrics()
    template = list(range(1500, 1530))
    config = CacheConfig(
        budget_bytes=8 << 20, warm_templates=[template], hit_rate_threshold=0.5, window=5
    )
    encoder = make_encoder(runtimes, onnx_dir, config, sink)
    for tail in range(12):
        encoder.encode(prompt([*template, tail + 1])[None])
    assert encoder.hit_rate == 1.0
    assert sink.counters.get(names.PREFIX_CACHE_REBUILDS, 0) == 0


def test_missing_or_inconsistent_manifest_fails_at_load(onnx_dir, tmp_path):
    with pytest.raises(ModelLoadError, match="missing"):
        CachedTextEncoder(tmp_path)
    manifest = json.loads((onnx_dir / kv_export.KV_MANIFEST_FILE).read_text())
    manifest["files"]["prefix"]["bytes"] += 1
    for name in (kv_export.KV_PREFIX_FILE, kv_export.KV_SUFFIX_FILE):
        (tmp_path / name).symlink_to(onnx_dir / name)
    (tmp_path / kv_export.KV_MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError, match="re-run the export"):
        CachedTextEncoder(tmp_path)


def test_serving_modules_do_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys; import facefuse.cache, facefuse.cache.encoder, facefuse.cache.runtime; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
