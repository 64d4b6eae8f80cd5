"""The affinity simulation (docker/affinity_sim.py) over facefuse.cache.PrefixKVCache."""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.docker.deploy_helpers import DEPLOY_DOC, load_docker_module


@pytest.fixture(scope="module")
def sim():
    return load_docker_module("affinity_sim")


@pytest.fixture(scope="module")
def cells(sim):
    run = {}
    for replicas, policy in ((1, "random"), (1, "hash"), (4, "random"), (4, "hash"), (4, "hash2")):
        run[(replicas, policy)] = sim.simulate_cell(
            replicas, 64, policy, budget_positions=1024, requests=700, warmup=200, seed=1
        )
    return run


def test_one_replica_routes_the_same_either_way(cells):
    # the same traffic (one seed) reaches the same single cache whatever the policy
    assert cells[(1, "random")] == dataclasses.replace(cells[(1, "hash")], policy="random")
    assert cells[(1, "hash")].load_imbalance == 1.0


def test_hashing_on_the_template_raises_the_hit_rate_across_replicas(cells):
    random, hashed = cells[(4, "random")], cells[(4, "hash")]
    # 64 templates do not fit one pod's budget; split four ways they nearly do
    assert hashed.prefix_hit_rate > random.prefix_hit_rate + 0.15
    assert hashed.token_hit_rate > random.token_hit_rate
    assert 0 < random.prefix_hit_rate < 1 and 0 < hashed.prefix_hit_rate <= 1
    # the price: the pod that owns the hottest templates serves more than its share
    assert hashed.load_imbalance > random.load_imbalance


def test_deterministic_for_a_seed(sim):
    runs = [sim.simulate_cell(4, 16, "random", 256, requests=150, warmup=50, seed=3) for _ in "ab"]
    assert runs[0] == runs[1]
    other = sim.simulate_cell(4, 16, "random", 256, requests=150, warmup=50, seed=4)
    assert other != runs[0]


def test_ring_moves_fewer_templates_than_modulo_when_scaling(sim):
    for replicas in (2, 4, 8):
        ring, modulo = sim.remapped_fraction(256, replicas)
        assert ring < modulo
    ring_8, _ = sim.remapped_fraction(256, 8)
    assert ring_8 < 0.25


def test_ring_routes_every_key_to_an_existing_pod(sim):
    ring = sim.HashRing(3)
    owners = {ring.route(f"template-{t}") for t in range(200)}
    assert owners == {0, 1, 2}


def test_unknown_policy_is_refused(sim):
    with pytest.raises(ValueError, match="policy"):
        sim.simulate_cell(2, 4, "round-robin", 64, 10, 0)


def test_docs_carry_the_simulated_table(sim):
    text = DEPLOY_DOC.read_text()
    header = sim.markdown_table([]).splitlines()[0]
    assert header in text
    assert "python docker/affinity_sim.py" in text


def test_splitting_hot_templates_trades_hits_for_balance(sim, cells):
    assert sim.expected_imbalance(4, 64, "random") == 1.0
    hashed = sim.expected_imbalance(4, 64, "hash", placements=10)
    split = sim.expected_imbalance(4, 64, "hash2", placements=10)
    assert 1.0 < split < hashed
    assert cells[(4, "random")].prefix_hit_rate < cells[(4, "hash2")].prefix_hit_rate
    assert cells[(4, "hash2")].prefix_hit_rate < cells[(4, "hash")].prefix_hit_rate
