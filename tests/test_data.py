"""Data: deterministic from the seed, and sharded so that the N workers' batches at step t together are
exactly the single-process global batch at step t (in every epoch, with and without augmentation)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from psring.train.data import ShardedBatches, SyntheticImages


@pytest.fixture(scope="module")
def data():
    return SyntheticImages(300, seed=5)


def test_synthetic_is_deterministic_per_seed():
    a, b, c = SyntheticImages(64, 1), SyntheticImages(64, 1), SyntheticImages(64, 2)
    assert np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
    assert not np.array_equal(a.images, c.images)
    assert a.images.shape == (64, 3, 32, 32) and a.images.dtype == np.uint8
    assert set(np.unique(SyntheticImages(2000, 0).labels)) == set(range(10))


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("augment", [False, True])
def test_union_of_worker_batches_is_the_global_batch(data, n, augment):
    b = 8
    single = ShardedBatches(data, 0, 1, n * b, seed=9, augment=augment)
    workers = [ShardedBatches(data, r, n, b, seed=9, augment=augment) for r in range(n)]
    steps = 2 * single.steps_per_epoch + 1  # crosses two epoch boundaries
    for t in range(steps):
        xs, ys = zip(*(w.get(t) for w in workers))
        x1, y1 = single.get(t)
        assert torch.equal(torch.cat(xs), x1) and torch.equal(torch.cat(ys), y1), f"step {t}"


def test_each_epoch_is_a_fresh_permutation_without_repeats(data):
    s = ShardedBatches(data, 0, 1, 50, seed=1)
    e0 = np.concatenate([s.global_indices(t) for t in range(s.steps_per_epoch)])
    e1 = np.concatenate([s.global_indices(t) for t in range(s.steps_per_epoch, 2 * s.steps_per_epoch)])
    assert len(set(e0)) == len(e0) == s.steps_per_epoch * 50
    assert not np.array_equal(e0, e1)


def test_global_batch_larger_than_data_is_refused(data):
    with pytest.raises(ValueError, match="exceeds"):
        ShardedBatches(data, 0, 4, 100, seed=0)
