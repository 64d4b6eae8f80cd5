"""The radix tree + LRU + byte budget of the prefix cache, on small fake K/V arrays (no model)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from facefuse.cache.radix import CacheKey, PrefixKVCache

KEY = CacheKey("model-a", 49407, 0)
LAYERS, DIM = 1, 2


def fake(tokens, start=0):
    """K/V and hidden rows that depend on the whole path up to each position (like a causal
    encoder): row i = cumulative sum of tokens[:i+1]."""
    tokens = np.asarray(tokens, dtype=np.int64)
    rows = np.cumsum(tokens).astype(np.float32)[start:]
    hidden = np.repeat(rows[:, None], DIM, axis=1)
    kv = np.broadcast_to(hidden, (LAYERS, 2, *hidden.shape)).copy()
    return kv, hidden


def insert(cache, tokens, key=KEY, start=0):
    kv, hidden = fake(tokens, start)
    return cache.insert_prefix(key, np.asarray(tokens), start, kv, hidden)


def gathered(match):
    kv = np.zeros((LAYERS, 2, match.length, DIM), np.float32)
    hidden = np.zeros((match.length, DIM), np.float32)
    match.kv_into(kv)
    match.hidden_into(hidden)
    return kv, hidden


def test_longest_common_prefix_and_split():
    cache = PrefixKVCache(1 << 20)
    assert insert(cache, [1, 2, 3, 4, 5]).reason == "inserted"
    assert cache.match_prefix(KEY, np.array([9, 9])).length == 0
    match = cache.match_prefix(KEY, np.array([1, 2, 3, 7, 7]))
    assert match.length == 3
    kv, hidden = gathered(match)
    np.testing.assert_array_equal(hidden[:, 0], [1, 3, 6])
    np.testing.assert_array_equal(kv[0, 1, :, 1], [1, 3, 6])
    # A diverging insert splits the node; only the new positions are added.
    result = insert(cache, [1, 2, 3, 7, 7, 7], start=3)
    assert (result.added_tokens, result.reason) == (3, "inserted")
    for path, expected in (([1, 2, 3, 4, 5], 5), ([1, 2, 3, 7, 7, 7, 8], 6), ([1, 2], 2)):
        match = cache.match_prefix(KEY, np.array(path))
        assert match.length == expected
        np.testing.assert_array_equal(gathered(match)[1][:, 0], np.cumsum(path[:expected]))
    assert cache.match_prefix(KEY, np.array([1, 2, 3, 4, 5]), limit=4).length == 4
    cache.check_invariants()


def test_insert_twice_is_no_double_insert():
    cache = PrefixKVCache(1 << 20)
    insert(cache, [5, 6, 7])
    used, items = cache.bytes_used, len(cache)
    result = insert(cache, [5, 6, 7])
    assert (result.added_tokens, result.reason) == (0, "present")
    assert (cache.bytes_used, len(cache)) == (used, items)
    # A shorter path that is already covered adds nothing either (it only splits).
    assert insert(cache, [5, 6]).reason == "present"
    assert cache.bytes_used == used
    cache.check_invariants()


def test_insert_refuses_when_the_matched_prefix_was_evicted():
    cache = PrefixKVCache(1 << 20)
    result = insert(cache, [1, 2, 3, 4], start=2)  # positions 0..1 are not in the tree
    assert (result.added_tokens, result.reason) == (0, "prefix-missing")
    assert cache.bytes_used == 0


def test_keys_are_separate_namespaces():
    cache = PrefixKVCache(1 << 20)
    insert(cache, [1, 2, 3])
    for other in (
        CacheKey("model-b", 49407, 0),
        CacheKey("model-a", 0, 0),
        CacheKey("model-a", 49407, 1),
    ):
        assert cache.match_prefix(other, np.array([1, 2, 3])).length == 0
    assert cache.match_prefix(KEY, np.array([1, 2, 3])).length == 3


def test_lru_evicts_least_recently_used_leaf():
    one = insert(PrefixKVCache(1 << 20), [1, 2, 3, 4]).added_tokens
    assert one == 4
    per_path = PrefixKVCache(1 << 20)
    insert(per_path, [10, 11, 12, 13])
    size = per_path.bytes_used
    cache = PrefixKVCache(2 * size + size // 2)  # room for two 4-token paths
    insert(cache, [10, 11, 12, 13])
    insert(cache, [20, 21, 22, 23])
    cache.match_prefix(KEY, np.array([10, 11, 12, 13]))  # 10.. is now more recent than 20..
    insert(cache, [30, 31, 32, 33])
    assert cache.match_prefix(KEY, np.array([20, 21, 22, 23]), touch=False).length == 0
    assert cache.match_prefix(KEY, np.array([10, 11, 12, 13]), touch=False).length == 4
    assert cache.match_prefix(KEY, np.array([30, 31, 32, 33]), touch=False).length == 4
    assert cache.evictions == 1
    cache.check_invariants()


def test_ten_thousand_distinct_prompts_stay_within_budget():
    rng = np.random.default_rng(0)
    template = [49406, *range(100, 115)]
    budget = 40_000
    cache = PrefixKVCache(budget, pinned_fraction=0.25)
    insert(cache, template)
    assert cache.pin(KEY, np.array(template))
    peak = 0
    lengths = rng.integers(1, 30, 10_000)
    pool = rng.integers(0, 49406, (10_000, 30)).tolist()
    for step in range(10_000):
        tail = pool[step][: lengths[step]]
        tokens = (template + tail) if step % 2 else [49406, *tail]
        match = cache.match_prefix(KEY, np.array(tokens))
        kv, hidden = fake(tokens, match.length)
        cache.insert_prefix(KEY, np.array(tokens), match.length, kv, hidden)
        ids = np.array(tokens + [49407] * (77 - len(tokens)))
        cache.put_exact(KEY, ids, np.zeros((77, DIM), np.float32), np.zeros(DIM, np.float32))
        peak = max(peak, cache.bytes_used)
        assert cache.bytes_used <= budget
        if step % 1000 == 0:
            cache.check_invariants()
    cache.check_invariants()
    assert cache.evictions > 1000
    assert peak > budget * 0.9  # the budget is used, not just respected
    # The pinned template survived the whole stream.
    assert cache.match_prefix(KEY, np.array(template)).length == len(template)


def test_budget_zero_is_a_clean_no_op():
    cache = PrefixKVCache(0)
    assert not cache.enabled
    assert insert(cache, [1, 2, 3]).reason == "disabled"
    assert not cache.put_exact(
        KEY, np.arange(77), np.zeros((77, 2), np.float32), np.zeros(2, np.float32)
    )
    assert cache.get_exact(KEY, np.arange(77)) is None
    assert cache.match_prefix(KEY, np.array([1, 2, 3])).length == 0
    assert not cache.pin(KEY, np.array([1, 2, 3]))
    assert (cache.bytes_used, len(cache), cache.evictions) == (0, 0, 0)
    cache.check_invariants()


def test_item_larger_than_budget_is_refused_without_evicting():
    cache = PrefixKVCache(600)
    insert(cache, [1, 2])
    used = cache.bytes_used
    result = insert(cache, list(range(3, 60)))
    assert result.reason == "over-budget"
    assert cache.bytes_used == used and cache.evictions == 0


def test_pins_protect_templates_and_respect_pinned_budget():
    probe = PrefixKVCache(1 << 20)
    insert(probe, [1, 2, 3, 4])
    size = probe.bytes_used
    cache = PrefixKVCache(3 * size, pinned_fraction=0.5)
    insert(cache, [1, 2, 3, 4])
    assert cache.pin(KEY, np.array([1, 2, 3, 4]))
    insert(cache, [9, 9, 9, 9])
    assert not cache.pin(KEY, np.array([9, 9, 9, 9]))  # would exceed half the budget
    assert not cache.pin(KEY, np.array([7, 7]))  # absent
    for start in range(20, 60, 4):  # churn
        insert(cache, list(range(start, start + 4)))
    assert cache.match_prefix(KEY, np.array([1, 2, 3, 4])).length == 4
    # Pinning a path that ends inside a node splits it; pins follow the split.
    insert(cache, [1, 2, 3, 4, 5, 6])
    assert cache.pin(KEY, np.array([1, 2]))
    cache.check_invariants()
    assert len(cache.pinned_templates()) == 2
    cache.unpin_all()
    assert cache.pinned_bytes() == 0
    cache.check_invariants()


def test_exact_entries():
    cache = PrefixKVCache(1 << 20)
    ids = np.arange(77)
    hidden = np.ones((77, DIM), np.float32)
    assert cache.put_exact(KEY, ids, hidden, np.ones(DIM, np.float32))
    assert not cache.put_exact(KEY, ids, hidden, np.ones(DIM, np.float32))  # present
    hidden[:] = 5  # the cache copied
    hit = cache.get_exact(KEY, ids)
    assert hit is not None and float(hit.hidden.max()) == 1.0
    assert cache.get_exact(CacheKey("model-a", 0, 0), ids) is None
    assert cache.get_exact(KEY, ids[::-1]) is None
    cache.check_invariants()


def test_concurrent_inserts_of_the_same_new_prefix():
    cache = PrefixKVCache(1 << 22)
    insert(cache, [1, 2, 3])
    tokens = [1, 2, 3, *range(100, 140)]
    threads, results = 8, []
    barrier = threading.Barrier(threads)

    def worker():
        match = cache.match_prefix(KEY, np.array(tokens))
        kv, hidden = fake(tokens, match.length)
        barrier.wait()
        results.append(cache.insert_prefix(KEY, np.array(tokens), match.length, kv, hidden))

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert sorted(r.reason for r in results) == ["inserted"] + ["present"] * (threads - 1)
    single = PrefixKVCache(1 << 22)
    insert(single, [1, 2, 3])
    insert(single, tokens, start=3)
    assert cache.bytes_used == single.bytes_used and len(cache) == len(single)
    match = cache.match_prefix(KEY, np.array(tokens))
    np.testing.assert_array_equal(gathered(match)[1][:, 0], np.cumsum(tokens))
    cache.check_invariants()


def test_invalid_arguments():
    with pytest.raises(ValueError):
        PrefixKVCache(-1)
    with pytest.raises(ValueError):
        PrefixKVCache(10, pinned_fraction=1.5)
    cache = PrefixKVCache(1 << 20)
    kv, hidden = fake([1, 2, 3])
    with pytest.raises(ValueError, match="positions"):
        cache.insert_prefix(KEY, np.array([1, 2, 3, 4]), 0, kv, hidden)
