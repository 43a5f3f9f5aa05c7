"""Accuracy of a model on a held-out split (no augmentation, the data set's own normalisation)."""
from __future__ import annotations

import numpy as np
import torch

from .data import normalization, resized


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataset_test, batch_size: int = 512,
             device: torch.device | str = "cpu", image_size: int | None = None) -> float:
    """Fraction of ``dataset_test`` (an ``ImageSet``) that ``model`` classifies correctly, in [0, 1].
    The model runs in eval mode (BatchNorm uses its running statistics) and is put back in the mode it
    was in, also on an error."""
    n = len(dataset_test)
    if n == 0:
        raise ValueError("cannot evaluate on an empty data set")
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    mean, std = (t.to(device) for t in normalization(dataset_test))
    was_training = model.training
    model.eval()
    try:
        correct = 0
        for lo in range(0, n, batch_size):
            images = np.asarray(dataset_test.images[lo:lo + batch_size])  # a folder's decoded here
            x = resized(torch.from_numpy(images).to(device).float().div_(255), image_size)
            y = torch.from_numpy(dataset_test.labels[lo:lo + batch_size]).to(device)
            correct += int((model((x - mean) / std).argmax(1) == y).sum())
        return correct / n
    finally:
        model.train(was_training)
