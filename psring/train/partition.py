"""How the training set is split over the N workers, redrawn every epoch from ``(seed, epoch)``.

Every function here is pure: it maps (labels or n, world, seed, epoch[, batch size]) to ``world`` index
arrays, one *shard* per worker, ordered so that worker ``r``'s batch at step ``t`` of the epoch is
``shard[r][t*B:(t+1)*B]``. Under BSP every worker must run the same number of steps, so an epoch has
``steps_in_epoch(shards, B) = min_r len(shard[r]) // B`` steps (``drop_last``); samples of a shard past
that many batches are not used that epoch (different ones every epoch, because every epoch reshuffles).

- ``uniform`` (the default): DistributedSampler-like equal shards, in the exact form that reproduces
  single-process training. A permutation of the data set is drawn from ``seed * 1_000_003 + epoch``; step
  ``t`` uses the global batch ``perm[t*N*B:(t+1)*N*B]`` and worker ``r`` takes its slice ``[r*B:(r+1)*B]``.
  So worker r's shard is the r-th B-block of every global batch, and the union of the N workers' batches
  at step t is exactly the single-process batch of N*B at step t. Steps per epoch: ``n // (N*B)``.
- ``stratified``: every shard holds every class in the global proportion. Each epoch, each class's
  indices are permuted, the classes are laid end to end (in an order drawn per epoch), and the result is
  dealt round-robin over the workers (starting at a worker drawn per epoch); each shard is then shuffled.
  As every class is a contiguous run of the deal, worker r receives ``floor(n_c/N)`` or ``ceil(n_c/N)``
  samples of class c (within one sample of the class's global share ``n_c/N``), and shards have
  ``floor(n/N)`` or ``ceil(n/N)`` samples. Steps per epoch: ``(n // N) // B``, the same every epoch.
- ``random``: random unequal shards. Each epoch, ``N-1`` cut points are drawn uniformly (with
  replacement) in ``[0, n - N*B]`` and cut the surplus ``n - N*B`` into N random parts (a flat Dirichlet,
  in the limit); shard r has ``B + part_r`` samples, taken as consecutive runs of a fresh permutation. So
  the shards cover the data set exactly once and each holds at least one batch. Steps per epoch:
  ``min_r size_r // B``, which changes from epoch to epoch; the big shards' extra samples are dropped
  for that epoch. This is what BSP does with equal local batches: every worker contributes one batch of
  B per step and the averaged gradient weighs the workers equally, so a small shard's samples are
  over-represented relative to a big shard's, whichever rule fills the steps.

Only ``uniform`` makes N workers reproduce a single-process run on the global batch bit for bit; with
``stratified`` and ``random`` each step's global batch is still N*B distinct samples of the epoch, but
not the same ones a single process would use, and (random) some samples are left out each epoch.
"""
from __future__ import annotations

import numpy as np

PARTITIONS = ("uniform", "stratified", "random")

_SALT = {"stratified": 0x5712A7, "random": 0x12A2D0}  # separate random streams per rule


def _rng(kind: str, seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([_SALT[kind], seed % 2**64, epoch])


def _check(n: int, world: int, batch_size: int) -> None:
    if world < 1 or batch_size < 1:
        raise ValueError(f"world ({world}) and batch size ({batch_size}) must be >= 1")
    if n < world * batch_size:
        raise ValueError(f"global batch {world * batch_size} exceeds the data set's {n} samples")


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of ``range(n)`` of ``uniform`` partitioning in ``epoch`` (torch's generator, so it
    is the same permutation a single process draws)."""
    import torch  # here: the launcher counts an --epochs run's steps (``epoch_steps``) without torch

    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g).numpy()


def uniform(n: int, world: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Equal shards of ``(n // (N*B)) * B`` samples: shard r is block r of every global batch."""
    _check(n, world, batch_size)
    steps = n // (world * batch_size)
    perm = epoch_permutation(n, seed, epoch)[:steps * world * batch_size].reshape(steps, world, batch_size)
    return [perm[:, r, :].reshape(-1) for r in range(world)]


def stratified(labels: np.ndarray, world: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Shards of ``floor(n/N)`` or ``ceil(n/N)`` samples, each with ``floor``/``ceil(n_c/N)`` of class c."""
    labels = np.asarray(labels)
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    rng = _rng("stratified", seed, epoch)
    classes = rng.permutation(np.unique(labels))
    order = np.concatenate([rng.permutation(np.flatnonzero(labels == c)) for c in classes]) \
        if len(labels) else np.empty(0, dtype=np.int64)
    owner = (np.arange(len(order)) + rng.integers(world)) % world
    return [rng.permutation(order[owner == r]) for r in range(world)]


def random_sizes(n: int, world: int, batch_size: int, seed: int, epoch: int) -> np.ndarray:
    """The shard sizes of ``random`` in ``epoch``: ``B`` plus a random part of ``n - N*B`` each."""
    _check(n, world, batch_size)
    surplus = n - world * batch_size
    cuts = np.sort(_rng("random", seed, epoch).integers(0, surplus + 1, size=world - 1))
    return batch_size + np.diff(np.concatenate([[0], cuts, [surplus]]))


def random(n: int, world: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Random unequal shards (sizes from ``random_sizes``) covering ``range(n)`` exactly once."""
    sizes = random_sizes(n, world, batch_size, seed, epoch)
    rng = _rng("random", seed, epoch)
    rng.integers(0, n - world * batch_size + 1, size=world - 1)  # the cut points, as in random_sizes
    return np.split(rng.permutation(n), np.cumsum(sizes)[:-1])


def shards(kind: str, labels: np.ndarray, world: int, batch_size: int, seed: int,
           epoch: int) -> list[np.ndarray]:
    """The ``world`` shards of ``epoch`` under rule ``kind`` (one of ``PARTITIONS``)."""
    n = len(labels)
    if kind == "uniform":
        return uniform(n, world, batch_size, seed, epoch)
    if kind == "stratified":
        _check(n, world, batch_size)
        return stratified(labels, world, seed, epoch)
    if kind == "random":
        return random(n, world, batch_size, seed, epoch)
    raise ValueError(f"unknown partition {kind!r}; available: {', '.join(PARTITIONS)}")


def steps_in_epoch(kind: str, n: int, world: int, batch_size: int, seed: int, epoch: int) -> int:
    """Steps every worker runs in ``epoch`` (BSP): the smallest shard's number of whole batches."""
    _check(n, world, batch_size)
    if kind == "uniform":
        return n // (world * batch_size)
    if kind == "stratified":
        return (n // world) // batch_size
    if kind == "random":
        return int(random_sizes(n, world, batch_size, seed, epoch).min()) // batch_size
    raise ValueError(f"unknown partition {kind!r}; available: {', '.join(PARTITIONS)}")


def epoch_steps(kind: str, n: int, world: int, batch_size: int, seed: int, epochs: int) -> list[int]:
    """The steps of each of the first ``epochs`` epochs (``steps_in_epoch``): ``--epochs E`` runs their sum."""
    if constant_steps(kind):
        return [steps_in_epoch(kind, n, world, batch_size, seed, 0)] * epochs
    return [steps_in_epoch(kind, n, world, batch_size, seed, e) for e in range(epochs)]


def constant_steps(kind: str) -> bool:
    """Whether ``kind`` has the same number of steps in every epoch (all but ``random``)."""
    return kind in ("uniform", "stratified")
