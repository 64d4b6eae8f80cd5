"""Simulated prefix-cache hit rate across replicas: random routing vs consistent hash on the
template key (the ``x-facefuse-template`` header of docs/deploy.md).

Every replica holds its own :class:`facefuse.cache.PrefixKVCache` (the radix tree + LRU + byte
budget that the ``text_encoder`` model uses), fed as the encoder feeds it: look up the longest
cached prefix of the prompt's token ids, then insert the rest of the path. Arrays are small
stand-ins with the proportions of the SD 1.5 text encoder (12 layers: per position 24 K/V rows
+ 1 hidden row + 1 final row), so the byte budget is expressed in token positions and converted
to real megabytes with :data:`REAL_BYTES_PER_POSITION`.

Traffic: ``templates`` prompt templates of :data:`TEMPLATE_TOKENS` tokens with Zipf(1.1)
popularity, each request the template plus a random tail of 4..16 tokens. A request is a
*prefix hit* when the whole template is reused from the cache of the pod that serves it.

Policies: ``random`` (any per-request balancer without affinity), ``hash`` (consistent hash on
the template key, as the DestinationRule configures), ``hash2`` (the client appends one of two
buckets to the key, so that each template spreads over at most two pods: the knob between
cache locality and load balance).

    python docker/affinity_sim.py            # the table of docs/deploy.md (about a minute)
    python docker/affinity_sim.py --quick    # a smaller grid
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
from dataclasses import dataclass

import numpy as np

from facefuse.cache import CacheKey, PrefixKVCache

TEMPLATE_TOKENS = 48  # bos + 47 template tokens
TAIL_TOKENS = (4, 16)
LAYERS, DIM = 12, 8  # stand-in shapes with SD 1.5's ratio of K/V to hidden rows
REAL_BYTES_PER_POSITION = (LAYERS * 2 + 2) * 768 * 4  # SD 1.5 CLIP: D = 768, fp32
KEY = CacheKey(model_id="sim", pad_token_id=49407, clip_skip=1)
RING_SIZE = 1024  # the DestinationRule's ringHash.minimumRingSize
POLICIES = ("random", "hash", "hash2")
ZIPF = 1.1  # template popularity exponent
SPLIT = 2  # buckets per template for "hash2"


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Consistent hashing with virtual nodes, as Envoy's ring hash load balancer does."""

    def __init__(self, replicas: int, ring_size: int = RING_SIZE, salt: int = 0):
        """``salt`` stands for the pods' names (their addresses place them on the ring)."""
        per_host = max(1, ring_size // replicas)
        points = sorted(
            (_hash64(f"pod-{salt}-{r}-{i}"), r) for r in range(replicas) for i in range(per_host)
        )
        self._hashes = [h for h, _ in points]
        self._owners = [r for _, r in points]

    def route(self, key: str) -> int:
        at = bisect.bisect(self._hashes, _hash64(key)) % len(self._hashes)
        return self._owners[at]


@dataclass(frozen=True)
class CellResult:
    replicas: int
    templates: int
    policy: str  # "random", "hash" or "hash2" (template key + one of 2 buckets)
    prefix_hit_rate: float  # requests whose whole template came from the cache
    token_hit_rate: float  # prompt tokens reused / prompt tokens
    load_imbalance: float  # busiest pod's requests / mean requests per pod, in this run


def zipf_weights(templates: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, templates + 1) ** ZIPF
    return weights / weights.sum()


def expected_imbalance(replicas: int, templates: int, policy: str, placements: int = 50) -> float:
    """Busiest pod's share of traffic / mean share, averaged over ``placements`` rings.

    One ring's figure depends on where the pods' names happen to fall (a single run can show
    anything from 1.0 to several times the mean), so the table reports this average, computed
    from the template popularity rather than from sampled requests.
    """
    if policy == "random":
        return 1.0
    weights = zipf_weights(templates)
    buckets = SPLIT if policy == "hash2" else 1
    worst = []
    for salt in range(placements):
        ring = HashRing(replicas, salt=1000 + salt)
        share = np.zeros(replicas)
        for t in range(templates):
            for b in range(buckets):
                share[ring.route(f"template-{t}#{b}")] += weights[t] / buckets
        worst.append(share.max() * replicas)
    return float(np.mean(worst))


def _arrays(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.zeros((LAYERS, 2, n, DIM), np.float32),
        np.zeros((n, DIM), np.float32),
        np.zeros((n, DIM), np.float32),
    )


def simulate_cell(
    replicas: int,
    templates: int,
    policy: str,
    budget_positions: int,
    requests: int,
    warmup: int,
    seed: int = 0,
) -> CellResult:
    """Run one (replicas, templates, policy) cell; deterministic for a seed."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    rng = np.random.default_rng(seed)  # traffic: the same requests for both policies
    route_rng = np.random.default_rng(seed + 1)  # random routing only
    bytes_per_position = sum(a.nbytes for a in _arrays(1)) + 8  # + the int64 token id
    caches = [PrefixKVCache(budget_positions * bytes_per_position) for _ in range(replicas)]
    prefixes = [
        np.concatenate(([49406], rng.integers(0, 49406, TEMPLATE_TOKENS - 1)))
        for _ in range(templates)
    ]
    choice = rng.choice(templates, size=requests, p=zipf_weights(templates))
    ring = HashRing(replicas, salt=seed)
    owners = [[ring.route(f"template-{t}#{b}") for b in range(SPLIT)] for t in range(templates)]
    served = np.zeros(replicas, dtype=np.int64)
    hits = reused = total = 0
    for n, t in enumerate(choice):
        tail = rng.integers(0, 49406, rng.integers(TAIL_TOKENS[0], TAIL_TOKENS[1] + 1))
        tokens = np.concatenate((prefixes[t], tail))
        if policy == "random":
            pod = int(route_rng.integers(replicas))
        else:  # "hash2": the client appends one of SPLIT buckets to a hot template's key
            pod = owners[t][int(route_rng.integers(SPLIT)) if policy == "hash2" else 0]
        cache = caches[pod]
        matched = cache.match_prefix(KEY, tokens).length
        if matched < len(tokens):
            kv, hidden, final = _arrays(len(tokens) - matched)
            cache.insert_prefix(KEY, tokens, matched, kv, hidden, final)
        if n >= warmup:
            served[pod] += 1
            hits += matched >= TEMPLATE_TOKENS
            reused += matched
            total += len(tokens)
    counted = requests - warmup
    return CellResult(
        replicas,
        templates,
        policy,
        hits / counted,
        reused / total,
        float(served.max() / served.mean()),
    )


def remapped_fraction(templates: int, replicas: int, salt: int = 0) -> tuple[float, float]:
    """Share of templates that change pod when ``replicas`` grows by one: ring vs modulo."""
    before, after = HashRing(replicas, salt=salt), HashRing(replicas + 1, salt=salt)
    keys = [f"template-{t}" for t in range(templates)]
    ring = sum(before.route(k) != after.route(k) for k in keys) / templates
    modulo = sum(_hash64(k) % replicas != _hash64(k) % (replicas + 1) for k in keys) / templates
    return ring, modulo


def run_grid(
    replica_counts,
    template_counts,
    budget_positions: int,
    requests: int,
    warmup: int,
    seed: int = 0,
) -> list[tuple[CellResult, ...]]:
    """One row per (templates, replicas): the cells of every policy in POLICIES order."""
    rows = []
    for templates in template_counts:
        for replicas in replica_counts:
            rows.append(
                tuple(
                    simulate_cell(
                        replicas, templates, policy, budget_positions, requests, warmup, seed
                    )
                    for policy in POLICIES
                )
            )
    return rows


def markdown_table(rows: list[tuple[CellResult, ...]]) -> str:
    """Hit rates of this run; load imbalance as :func:`expected_imbalance` (random: 1.00)."""
    lines = [
        "| templates | replicas | prefix hit: random | hash | hash2 | tokens reused: random "
        "| hash | hash2 | busiest pod / mean: hash | hash2 |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for cells in rows:
        first = cells[0]
        hit = " | ".join(f"{c.prefix_hit_rate:.0%}" for c in cells)
        tokens = " | ".join(f"{c.token_hit_rate:.0%}" for c in cells)
        load = " | ".join(
            f"{expected_imbalance(first.replicas, first.templates, p):.2f}" for p in POLICIES[1:]
        )
        lines.append(f"| {first.templates} | {first.replicas} | {hit} | {tokens} | {load} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small grid in a few seconds")
    parser.add_argument(
        "--budget-positions",
        type=int,
        default=1024,
        help="per-pod cache budget in token positions (default 1024)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        replica_counts, template_counts, requests, warmup = (1, 4), (8, 64), 1500, 500
    else:
        replica_counts, template_counts, requests, warmup = (
            (1, 2, 4, 8),
            (4, 16, 64, 256),
            6000,
            2000,
        )
    rows = run_grid(
        replica_counts, template_counts, args.budget_positions, requests, warmup, args.seed
    )
    mb = args.budget_positions * REAL_BYTES_PER_POSITION / 2**20
    print(
        f"Per-pod prefix cache budget: {args.budget_positions} token positions (= {mb:.0f} MB "
        f"for SD 1.5's text encoder in fp32); {TEMPLATE_TOKENS}-token templates, Zipf(1.1) "
        f"popularity, tails of {TAIL_TOKENS[0]}..{TAIL_TOKENS[1]} tokens; {requests - warmup} "
        f"requests counted after {warmup} warm-up requests; seed {args.seed}.\n"
    )
    print(markdown_table(rows))
    print("\nTemplates that move to another pod when one replica is added (256 templates):\n")
    print("| replicas | consistent hash ring | hash modulo replicas |\n| ---: | ---: | ---: |")
    for replicas in (1, 2, 4, 8):
        ring, modulo = remapped_fraction(256, replicas, args.seed)
        print(f"| {replicas} -> {replicas + 1} | {ring:.0%} | {modulo:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
