"""Data for the trainer: the data sets (``datasets``), and every worker's batch of every step.

Sharding: every epoch the data set is split into one shard per worker by the rule ``partition`` (see
``partition``: ``uniform`` by default, ``stratified`` or ``random``), redrawn from ``(seed, epoch)``.
Worker ``r`` takes batch ``t`` of its shard at step ``t`` of the epoch; every worker runs the same
number of steps per epoch (BSP), the smallest shard's number of whole batches (``drop_last``).

With ``uniform`` (DistributedSampler's contract, made exact for equivalence) every epoch a permutation of
the data set is drawn from ``seed + epoch``; step ``t`` of that epoch uses the global batch
``perm[t*N*B:(t+1)*N*B]`` and worker ``r`` takes its contiguous slice ``[r*B:(r+1)*B]``. The union of the
N workers' batches at step t is therefore exactly the single-process batch of N*B at step t, and N
workers reproduce single-process training bit for bit. ``stratified`` and ``random`` do not: their
global batch at step t is N*B distinct samples, but not those a single process would draw.
"""
from __future__ import annotations

import numpy as np
import torch

from . import partition as part
from .datasets import CIFAR10_MEAN, CIFAR10_STD, ImageSet, SyntheticImages, build_dataset

__all__ = ["MEAN", "STD", "ImageSet", "ShardedBatches", "SyntheticImages", "build_dataset", "normalization"]

# CIFAR-10's channel statistics; the synthetic set is generated with the same scale of pixel values.
MEAN = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
STD = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)


def resized(x: torch.Tensor, size: int | None) -> torch.Tensor:
    """A batch of images (B x C x H x W, in [0, 1]) at ``size`` x ``size`` pixels (bilinear; antialiased when
    shrinking), so a 32x32 set feeds a 224x224 model; unchanged when it already is (or ``size`` is None).
    Per sample, so a sample is the same whichever worker holds it."""
    if size is None or tuple(x.shape[-2:]) == (size, size):
        return x
    shrink = size < max(x.shape[-2:])
    return torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False,
                                           antialias=shrink)


def normalization(data) -> tuple[torch.Tensor, torch.Tensor]:
    """The data set's per-channel mean and std as 1 x C x 1 x 1 tensors (CIFAR-10's if it has none)."""
    mean, std = getattr(data, "mean", None), getattr(data, "std", None)
    if mean is None or std is None:
        return MEAN, STD
    return torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), \
        torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)


class ShardedBatches:
    """Worker ``rank``'s batch of every global step; see the module docstring for the rule.

    ``steps_per_epoch`` is the number of steps of every epoch, or None with ``partition="random"``,
    whose shard sizes (and so steps) are redrawn every epoch: use ``steps_in_epoch(epoch)`` there.
    """

    def __init__(self, data: ImageSet, rank: int, world: int, batch_size: int, seed: int,
                 augment: bool = False, partition: str = "uniform", image_size: int | None = None):
        if partition not in part.PARTITIONS:
            raise ValueError(f"unknown partition {partition!r}; available: {', '.join(part.PARTITIONS)}")
        self.data, self.rank, self.world, self.batch = data, rank, world, batch_size
        self.seed, self.augment, self.partition, self.image_size = seed, augment, partition, image_size
        self.global_batch = batch_size * world
        if len(data) < self.global_batch:
            raise ValueError(f"global batch {self.global_batch} exceeds the data set's {len(data)} samples")
        self.steps_per_epoch = self.steps_in_epoch(0) if part.constant_steps(partition) else None
        self.mean, self.std = normalization(data)
        self.hflip = getattr(data, "hflip", True)
        self._starts = [0]  # first global step of epochs 0, 1, ... (as far as computed)
        self._epoch, self._shards = -1, None

    def steps_in_epoch(self, epoch: int) -> int:
        return part.steps_in_epoch(self.partition, len(self.data), self.world, self.batch, self.seed, epoch)

    def epoch_of(self, step: int) -> tuple[int, int]:
        """(epoch, step within that epoch) of global step ``step``."""
        if self.steps_per_epoch is not None:
            return divmod(step, self.steps_per_epoch)
        while self._starts[-1] <= step:
            self._starts.append(self._starts[-1] + self.steps_in_epoch(len(self._starts) - 1))
        epoch = int(np.searchsorted(self._starts, step, side="right")) - 1
        return epoch, step - self._starts[epoch]

    def shards(self, epoch: int) -> list[np.ndarray]:
        """Every worker's shard of ``epoch`` (cached for the current epoch)."""
        if epoch != self._epoch:
            self._shards = part.shards(self.partition, self.data.labels, self.world, self.batch, self.seed,
                                       epoch)
            self._epoch = epoch
        return self._shards

    def indices(self, step: int, rank: int | None = None) -> np.ndarray:
        """The data set indices of worker ``rank``'s (default: this worker's) batch at ``step``."""
        epoch, t = self.epoch_of(step)
        shard = self.shards(epoch)[self.rank if rank is None else rank]
        return shard[t * self.batch:(t + 1) * self.batch]

    def global_indices(self, step: int) -> np.ndarray:
        """The union of the N workers' batches at ``step``, in rank order (with ``uniform``: exactly the
        single-process batch of N*B at that step)."""
        return np.concatenate([self.indices(step, r) for r in range(self.world)])

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.indices(step)
        x = torch.from_numpy(self.data.images[idx]).float().div_(255)
        if self.augment:
            x = self._augment(x, step, self.rank * self.batch)
        x = (resized(x, self.image_size) - self.mean) / self.std
        return x, torch.from_numpy(self.data.labels[idx])

    def _augment(self, x: torch.Tensor, step: int, lo: int) -> torch.Tensor:
        """Random crop (pad 4) and, where the data set allows it (``hflip``), horizontal flip. The random
        draws are made for the whole global batch from (seed, step) and sliced, so a sample is augmented
        the same way whichever worker holds it."""
        g = torch.Generator().manual_seed(self.seed * 7_919 + step)
        flips = torch.rand(self.global_batch, generator=g)[lo:lo + self.batch] < 0.5
        offs = torch.randint(0, 9, (self.global_batch, 2), generator=g)[lo:lo + self.batch]
        h, w = x.shape[-2:]
        padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
        out = torch.empty_like(x)
        for i in range(len(x)):
            dy, dx = int(offs[i, 0]), int(offs[i, 1])
            img = padded[i, :, dy:dy + h, dx:dx + w]
            out[i] = img.flip(-1) if self.hflip and flips[i] else img
        return out
