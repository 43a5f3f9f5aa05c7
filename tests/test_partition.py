"""Partition rules: uniform is exactly the historical global-batch rule; stratified keeps class proportions
per shard; random has unequal shards that still cover the data once; all reshuffle every epoch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from psring.train import partition as part
from psring.train.data import ShardedBatches, SyntheticImages

N_SAMPLES, B = 300, 8


@pytest.fixture(scope="module")
def data():
    return SyntheticImages(N_SAMPLES, seed=5)


def old_rule(n, rank, world, batch, seed, step):
    """The sharding rule before partitions existed, verbatim: global permutation per epoch, slice r."""
    steps = n // (batch * world)
    epoch, t = divmod(step, steps)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).numpy()
    glob = perm[t * batch * world:(t + 1) * batch * world]
    return glob[rank * batch:(rank + 1) * batch]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_uniform_is_the_old_rule_bit_for_bit(data, world):
    workers = [ShardedBatches(data, r, world, B, seed=9) for r in range(world)]
    explicit = [ShardedBatches(data, r, world, B, seed=9, partition="uniform") for r in range(world)]
    single = ShardedBatches(data, 0, 1, world * B, seed=9)
    assert workers[0].steps_per_epoch == N_SAMPLES // (world * B)
    for t in range(2 * workers[0].steps_per_epoch + 3):  # crosses epoch boundaries
        for r, (w, e) in enumerate(zip(workers, explicit)):
            want = old_rule(N_SAMPLES, r, world, B, 9, t)
            assert np.array_equal(w.indices(t), want) and np.array_equal(e.indices(t), want), (r, t)
        union = np.concatenate([w.indices(t) for w in workers])
        assert np.array_equal(union, single.indices(t)) and np.array_equal(union, workers[0].global_indices(t))


def test_stratified_shards_keep_the_class_proportions():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, size=1003)
    counts = np.bincount(labels, minlength=10)
    for world in (2, 3, 4, 7):
        for epoch in range(3):
            shards = part.stratified(labels, world, seed=1, epoch=epoch)
            assert sorted(np.concatenate(shards).tolist()) == list(range(len(labels)))  # a partition
            assert {len(s) for s in shards} <= {len(labels) // world, -(-len(labels) // world)}
            for s in shards:
                got = np.bincount(labels[s], minlength=10)
                assert np.all(np.abs(got - counts / len(labels) * len(s)) <= 1), (world, epoch, got)
                assert np.all((got == counts // world) | (got == -(-counts // world)))


def test_stratified_guarantee_holds_for_skewed_classes():
    labels = np.repeat(np.arange(4), [500, 40, 7, 1])
    for world in (2, 3, 5):
        shards = part.stratified(labels, world, seed=3, epoch=1)
        counts = np.bincount(labels)
        for s in shards:
            got = np.bincount(labels[s], minlength=4)
            assert np.all((got == counts // world) | (got == -(-counts // world))), (world, got)


def test_stratified_batches_and_steps(data):
    world = 3
    ws = [ShardedBatches(data, r, world, B, seed=2, partition="stratified") for r in range(world)]
    assert ws[0].steps_per_epoch == (N_SAMPLES // world) // B
    for e in range(2):
        seen = np.concatenate([w.indices(e * ws[0].steps_per_epoch + t) for w in ws
                               for t in range(ws[0].steps_per_epoch)])
        assert len(set(seen.tolist())) == len(seen) == world * B * ws[0].steps_per_epoch


def test_random_shards_are_unequal_cover_everything_once_and_hold_a_batch():
    n, world = 1000, 4
    for epoch in range(5):
        shards = part.random(n, world, B, seed=7, epoch=epoch)
        sizes = [len(s) for s in shards]
        assert len(set(sizes)) > 1, sizes
        assert min(sizes) >= B and sum(sizes) == n
        assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(n))
        assert np.array_equal(sizes, part.random_sizes(n, world, B, seed=7, epoch=epoch))
        assert part.steps_in_epoch("random", n, world, B, 7, epoch) == min(sizes) // B
    assert [len(s) for s in part.random(world * B, world, B, 0, 0)] == [B] * world  # no surplus: all B


def test_random_steps_vary_by_epoch_and_every_worker_runs_them(data):
    world = 3
    ws = [ShardedBatches(data, r, world, B, seed=4, partition="random") for r in range(world)]
    assert ws[0].steps_per_epoch is None
    steps = [ws[0].steps_in_epoch(e) for e in range(6)]
    assert all(s >= 1 for s in steps) and len(set(steps)) > 1, steps
    step = 0
    for e, k in enumerate(steps):
        sh = part.random(N_SAMPLES, world, B, 4, e)
        for t in range(k):
            for r, w in enumerate(ws):
                assert w.epoch_of(step) == (e, t)
                assert np.array_equal(w.indices(step), sh[r][t * B:(t + 1) * B])
            x, y = ws[1].get(step)
            assert x.shape == (B, 3, 32, 32) and y.shape == (B,)
            step += 1


@pytest.mark.parametrize("kind", part.PARTITIONS)
def test_each_epoch_reshuffles_and_same_seed_gives_same_partition(kind):
    labels = np.random.default_rng(1).integers(0, 10, size=400)
    a0 = part.shards(kind, labels, 3, B, seed=11, epoch=0)
    a0_again = part.shards(kind, labels, 3, B, seed=11, epoch=0)
    a1 = part.shards(kind, labels, 3, B, seed=11, epoch=1)
    other = part.shards(kind, labels, 3, B, seed=12, epoch=0)
    assert all(np.array_equal(x, y) for x, y in zip(a0, a0_again))
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a0, a1))
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a0, other))


def test_augmented_batches_are_deterministic_for_every_partition(data):
    for kind in part.PARTITIONS:
        a = ShardedBatches(data, 1, 2, B, seed=3, augment=True, partition=kind)
        b = ShardedBatches(data, 1, 2, B, seed=3, augment=True, partition=kind)
        for t in (0, 5, 30):
            assert all(torch.equal(u, v) for u, v in zip(a.get(t), b.get(t))), (kind, t)


def test_bad_partition_and_too_big_batches_are_refused(data):
    with pytest.raises(ValueError, match="uniform, stratified, random"):
        ShardedBatches(data, 0, 2, B, seed=0, partition="dirichlet")
    for kind in part.PARTITIONS:
        with pytest.raises(ValueError, match="exceeds"):
            ShardedBatches(data, 0, 4, 100, seed=0, partition=kind)
