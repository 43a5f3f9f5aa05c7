"""scikit-learn's bundled handwritten digits as a 3x32x32 image set (optional extra ``psring[digits]``,
i.e. ``scikit-learn>=1.0``; nothing is downloaded: the 1,797 images ship with scikit-learn).

The 8x8 images of 17 gray levels (0..16) are upscaled to 32x32 bilinearly (torch, ``align_corners=False``),
scaled to 0..255, rounded to uint8 and replicated to 3 channels, so every model of ``models`` takes them
unchanged. The held-out test split is 20% of every class (rounded), drawn with a fixed seed: it is the
same whatever the training seed. Both splits are in a fixed shuffled order. Digits are not mirror
symmetric, so ``hflip`` is False (augmentation crops but does not flip them).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .datasets import ImageSet, _check_split

TEST_FRACTION = 0.2
SPLIT_SEED = 0  # the train/test split is fixed, independent of the training seed
INSTALL_HINT = "the digits data set needs scikit-learn: pip install 'psring[digits]'"


def _digits() -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits as sk_load_digits
    except ImportError:
        raise ValueError(INSTALL_HINT) from None
    d = sk_load_digits()
    x = torch.from_numpy(np.asarray(d.images, dtype=np.float32)).unsqueeze(1)  # N x 1 x 8 x 8, 0..16
    x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False)
    x = (x * (255 / 16)).round_().clamp_(0, 255).to(torch.uint8).expand(-1, 3, -1, -1)
    return np.ascontiguousarray(x.numpy()), np.asarray(d.target, dtype=np.int64)


def split_indices(labels: np.ndarray, test_fraction: float = TEST_FRACTION,
                  seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Stratified train/test indices: ``round(test_fraction * n_c)`` samples of every class c go to
    test; both lists are shuffled. Deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        k = round(test_fraction * len(idx))
        test.append(idx[:k])
        train.append(idx[k:])
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))


def load_digits(split: str = "train") -> ImageSet:
    """The ``split`` ("train" or "test") of the digits set; mean/std are the train split's."""
    _check_split(split)
    images, labels = _digits()
    train, test = split_indices(labels)
    pixels = images[train].astype(np.float64) / 255
    mean = pixels.mean(axis=(0, 2, 3))
    std = pixels.std(axis=(0, 2, 3))
    idx = train if split == "train" else test
    return ImageSet(images[idx], labels[idx], name="digits", split=split, mean=tuple(mean), std=tuple(std),
                    hflip=False)
