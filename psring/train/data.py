"""Data: a deterministic, learnable CIFAR-shaped synthetic set, and the per-worker sharding.

Sharding follows DistributedSampler's contract, made exact for equivalence: every epoch a permutation of
the data set is drawn from ``seed + epoch``; step ``t`` of that epoch uses the global batch
``perm[t*N*B:(t+1)*N*B]`` and worker ``r`` takes its contiguous slice ``[r*B:(r+1)*B]``. The union of the
N workers' batches at step t is therefore exactly the single-process batch of N*B at step t. The last
incomplete global batch of an epoch is dropped (``drop_last``), so every worker runs the same steps.
"""
from __future__ import annotations

import numpy as np
import torch

from .models import NUM_CLASSES

# CIFAR-10's channel statistics; the synthetic set is generated with the same scale of pixel values.
MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)


class SyntheticImages:
    """``n`` uint8 images of 3x32x32 in 10 classes, generated from ``seed`` alone.

    Each class has a smooth random prototype (low-resolution noise, upsampled); a sample is its class
    prototype plus strong per-pixel noise and a random brightness shift. A CNN separates the classes
    after some hundred steps, so the loss visibly falls but is not solved in the first few steps.
    """

    def __init__(self, n: int = 10_000, seed: int = 0):
        rng = np.random.default_rng(seed)
        coarse = rng.normal(0, 1, size=(NUM_CLASSES, 3, 4, 4)).astype(np.float32)
        protos = coarse.repeat(8, axis=2).repeat(8, axis=3)  # 10 x 3 x 32 x 32, blocky but distinct
        self.labels = rng.integers(0, NUM_CLASSES, size=n).astype(np.int64)
        noise = rng.standard_normal(size=(n, 3, 32, 32), dtype=np.float32)
        shift = rng.normal(0, 0.3, size=(n, 1, 1, 1)).astype(np.float32)
        noise *= 1.2
        noise += 0.1 * protos[self.labels]
        noise += shift
        noise *= 40
        noise += 128
        self.images = np.clip(noise, 0, 255, out=noise).astype(np.uint8)

    def __len__(self) -> int:
        return len(self.labels)


def build_dataset(name: str, num_samples: int, seed: int) -> SyntheticImages:
    if name != "synthetic":
        raise ValueError(f"unknown dataset {name!r}; available: synthetic")
    return SyntheticImages(num_samples, seed)


class ShardedBatches:
    """Worker ``rank``'s batch of every global step; see the module docstring for the rule."""

    def __init__(self, data: SyntheticImages, rank: int, world: int, batch_size: int, seed: int,
                 augment: bool = False):
        self.data, self.rank, self.world, self.batch = data, rank, world, batch_size
        self.seed, self.augment = seed, augment
        self.global_batch = batch_size * world
        self.steps_per_epoch = len(data) // self.global_batch
        if self.steps_per_epoch < 1:
            raise ValueError(f"global batch {self.global_batch} exceeds the data set's {len(data)} samples")
        self._epoch, self._perm = -1, None

    def global_indices(self, step: int) -> np.ndarray:
        epoch, t = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = torch.randperm(len(self.data), generator=g).numpy()
            self._epoch = epoch
        return self._perm[t * self.global_batch:(t + 1) * self.global_batch]

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        lo = self.rank * self.batch
        idx = self.global_indices(step)[lo:lo + self.batch]
        x = torch.from_numpy(self.data.images[idx]).float().div_(255)
        if self.augment:
            x = self._augment(x, step, lo)
        x = (x - MEAN) / STD
        return x, torch.from_numpy(self.data.labels[idx])

    def _augment(self, x: torch.Tensor, step: int, lo: int) -> torch.Tensor:
        """Random crop (pad 4) and horizontal flip. The random draws are made for the whole global batch
        from (seed, step) and sliced, so a sample is augmented the same way whichever worker holds it."""
        g = torch.Generator().manual_seed(self.seed * 7_919 + step)
        flips = torch.rand(self.global_batch, generator=g)[lo:lo + self.batch] < 0.5
        offs = torch.randint(0, 9, (self.global_batch, 2), generator=g)[lo:lo + self.batch]
        padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
        out = torch.empty_like(x)
        for i in range(len(x)):
            dy, dx = int(offs[i, 0]), int(offs[i, 1])
            img = padded[i, :, dy:dy + 32, dx:dx + 32]
            out[i] = img.flip(-1) if flips[i] else img
        return out
