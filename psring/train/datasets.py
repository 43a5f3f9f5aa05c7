"""The data sets: every one is an ``ImageSet`` of uint8 images (N x 3 x H x W), with a train and a held-out
test split and its own per-channel normalisation statistics. The bundled ones are 10 classes of 32x32;
a user's own (``folder:DIR``, ``npz:FILE``) are ``files``'.

- ``synthetic``: generated from the seed alone (no files); the test split shares the train split's
  class prototypes but draws its samples from a separate random stream.
- ``cifar10``: CIFAR-10 read from the official *binary* version (see ``load_cifar10``).
- ``digits``: scikit-learn's bundled 8x8 handwritten digits, upscaled (see ``load_digits``); needs the
  optional extra ``pip install 'psring[digits]'`` (scikit-learn>=1.0).

``num_samples`` caps the returned split: synthetic generates that many samples; the real sets return
their first ``num_samples`` (all of the split when None or larger than it).
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import numpy as np

NUM_CLASSES = 10
SPLITS = ("train", "test")
DATASETS = ("synthetic", "cifar10", "digits")
GENERATED = ("synthetic", "digits")  # the sets made from their arguments alone: no file, no environment, no directory
SYNTHETIC_CHUNK = 512  # images generated at a time (1.5 MB of float32: in cache)

# CIFAR-10's per-channel statistics over its training set (pixels scaled to [0, 1]).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
CIFAR10_FOLDER = "cifar-10-batches-bin"  # what the tarball extracts to
CIFAR10_RECORD = 1 + 3 * 32 * 32
CIFAR10_FILES = {"train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)), "test": ("test_batch.bin",)}


class ImageSet:
    """``images`` (uint8, N x C x H x W) and ``labels`` (int64, N) with what training needs to know:
    ``num_classes``, ``mean``/``std`` (per channel, of pixels in [0, 1], from the train split),
    ``hflip`` (whether a horizontal flip is a label-preserving augmentation), ``name`` and ``split``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, *, name: str, split: str,
                 mean: tuple[float, ...], std: tuple[float, ...], hflip: bool = True,
                 num_classes: int = NUM_CLASSES):
        self.images, self.labels = images, labels
        self.name, self.split, self.num_classes, self.hflip = name, split, num_classes, hflip
        self.mean, self.std = tuple(float(v) for v in mean), tuple(float(v) for v in std)

    @property
    def channels(self) -> int:
        return self.images.shape[1]

    @property
    def size(self) -> int:
        """Image side in pixels (images are square)."""
        return self.images.shape[-1]

    def __len__(self) -> int:
        return len(self.labels)

    def head(self, num_samples: int | None) -> ImageSet:
        """This set cut to its first ``num_samples`` (itself when None or not smaller)."""
        if num_samples is None or num_samples >= len(self):
            return self
        out = copy.copy(self)
        out.images, out.labels = self.images[:num_samples], self.labels[:num_samples]
        return out


class SyntheticImages(ImageSet):
    """``n`` uint8 images of 3x32x32 in 10 classes, generated from ``seed`` alone.

    Each class has a smooth random prototype (low-resolution noise, upsampled); a sample is its class
    prototype plus strong per-pixel noise and a random brightness shift. A CNN separates the classes
    after some hundred steps, so the loss visibly falls but is not solved in the first few steps.
    ``split="test"`` draws other samples of the same prototypes (a separate stream of ``seed``).
    Pixel values are on CIFAR-10's scale, and the set is normalised with CIFAR-10's statistics.
    """

    def __init__(self, n: int = 10_000, seed: int = 0, split: str = "train"):
        _check_split(split)
        rng = np.random.default_rng(seed)
        coarse = rng.normal(0, 1, size=(NUM_CLASSES, 3, 4, 4)).astype(np.float32)
        protos = coarse.repeat(8, axis=2).repeat(8, axis=3)  # 10 x 3 x 32 x 32, blocky but distinct
        if split == "test":
            rng = np.random.default_rng([seed, 0x7E57])
        labels = rng.integers(0, NUM_CLASSES, size=n).astype(np.int64)
        # pixel = clip((noise * 1.2 + 0.1 * prototype + shift) * 40 + 128), in float32, cast to uint8; computed
        # SYNTHETIC_CHUNK images at a time (the noise drawn in chunks is the same stream as in one draw), so that
        # no temporary of the whole set is made: 0.5 s of CPU a worker where whole-set temporaries took 0.8-1.0
        scaled = 0.1 * protos
        noise = np.empty((n, 3, 32, 32), np.float32)
        for i in range(0, n, SYNTHETIC_CHUNK):
            part = noise[i:i + SYNTHETIC_CHUNK]
            rng.standard_normal(out=part, dtype=np.float32)
            part *= 1.2
            part += scaled[labels[i:i + SYNTHETIC_CHUNK]]
        shift = rng.normal(0, 0.3, size=(n, 1, 1, 1)).astype(np.float32)  # (drawn after all of the noise)
        images = np.empty((n, 3, 32, 32), np.uint8)
        for i in range(0, n, SYNTHETIC_CHUNK):
            part = noise[i:i + SYNTHETIC_CHUNK]
            part += shift[i:i + SYNTHETIC_CHUNK]
            part *= 40
            part += 128
            images[i:i + SYNTHETIC_CHUNK] = np.clip(part, 0, 255, out=part)  # (as astype: truncated to uint8)
        super().__init__(images, labels, name="synthetic", split=split, mean=CIFAR10_MEAN, std=CIFAR10_STD)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; available: {', '.join(SPLITS)}")


def data_root(data_dir: str | os.PathLike | None = None) -> Path:
    """Where data sets are looked for: ``data_dir``, else ``$PSRING_DATA``, else ``~/.cache/psring``."""
    return Path(data_dir or os.environ.get("PSRING_DATA") or "~/.cache/psring").expanduser()


def cifar10_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The folder with CIFAR-10's ``.bin`` files: the root itself if it holds them, else
    ``<root>/cifar-10-batches-bin`` (where ``tar xzf cifar-10-binary.tar.gz -C <root>`` puts them)."""
    root = data_root(data_dir)
    return root if (root / CIFAR10_FILES["train"][0]).is_file() or (root / CIFAR10_FILES["test"][0]).is_file() \
        else root / CIFAR10_FOLDER


def read_cifar10_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images (N x 3 x 32 x 32 uint8) and labels (int64) of one file of the binary version: records of
    1 label byte then 3072 pixel bytes, the red then green then blue plane, each 32 rows of 32.
    The official files have 10,000 records; any positive whole number of records is accepted (so a
    subset can be used), but a size that is not a multiple of 3073 bytes (a truncated or foreign file)
    or a label byte above 9 is refused."""
    size = path.stat().st_size
    if size == 0 or size % CIFAR10_RECORD:
        raise ValueError(f"{path}: {size} bytes is not a whole, non-zero number of {CIFAR10_RECORD}-byte "
                         f"records (truncated, or not the CIFAR-10 binary version?); download it again from "
                         f"{CIFAR10_URL}")
    raw = np.fromfile(path, dtype=np.uint8).reshape(-1, CIFAR10_RECORD)
    labels = raw[:, 0].astype(np.int64)
    bad = np.flatnonzero(labels >= NUM_CLASSES)
    if len(bad):
        raise ValueError(f"{path}: record {bad[0]} has label {labels[bad[0]]} (> 9): not the CIFAR-10 "
                         f"binary version ({CIFAR10_URL})")
    return np.ascontiguousarray(raw[:, 1:]).reshape(-1, 3, 32, 32), labels


def check_available(name: str, data_dir: str | os.PathLike | None = None) -> None:
    """Raise the loaders' one-line ValueError now, before any process starts, if ``name`` cannot load."""
    from . import files

    if files.is_files(name):
        files.check(name)
    elif name == "cifar10":
        folder = cifar10_dir(data_dir)
        for f in CIFAR10_FILES["train"] + CIFAR10_FILES["test"]:
            if not (folder / f).is_file():
                load_cifar10(data_dir, "train" if f in CIFAR10_FILES["train"] else "test")  # raises
            if (folder / f).stat().st_size % CIFAR10_RECORD:
                read_cifar10_file(folder / f)  # raises
    elif name == "digits":
        try:
            import sklearn  # noqa: F401
        except ImportError:
            from .digits import INSTALL_HINT

            raise ValueError(INSTALL_HINT) from None


def load_cifar10(data_dir: str | os.PathLike | None = None, split: str = "train") -> ImageSet:
    """CIFAR-10's train (``data_batch_1.bin`` ... ``data_batch_5.bin``) or test (``test_batch.bin``) split,
    from ``cifar10_dir(data_dir)``; a missing file raises a ValueError that says what to download where."""
    _check_split(split)
    folder = cifar10_dir(data_dir)
    missing = [f for f in CIFAR10_FILES[split] if not (folder / f).is_file()]
    if missing:
        root = data_root(data_dir)
        raise ValueError(f"CIFAR-10 not found: {folder / missing[0]} is missing; download the CIFAR-10 "
                         f"binary version from {CIFAR10_URL} and extract it with "
                         f"'tar xzf cifar-10-binary.tar.gz -C {root}' (or set PSRING_DATA to the folder "
                         f"holding the .bin files)")
    parts = [read_cifar10_file(folder / f) for f in CIFAR10_FILES[split]]
    images = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
    labels = np.concatenate([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
    return ImageSet(images, labels, name="cifar10", split=split, mean=CIFAR10_MEAN, std=CIFAR10_STD)


def dataset_classes(name: str) -> int:
    """The classes of data set ``name``: 10 for the bundled ones, a folder's or an npz file's own."""
    from . import files

    return files.classes(name) if files.is_files(name) else NUM_CLASSES


def build_dataset(name: str, num_samples: int | None = None, seed: int = 0,
                  data_dir: str | os.PathLike | None = None, split: str = "train",
                  image_size: int | None = None) -> ImageSet:
    """The ``split`` of data set ``name`` (one of ``DATASETS``, ``folder:DIR`` or ``npz:FILE``), cut to
    ``num_samples`` (see the module docstring). ``seed`` generates ``synthetic``; the real sets and their
    splits do not depend on it. ``image_size``: the side a folder's images are decoded at (default 32)."""
    from . import files

    _check_split(split)
    made = _prebuilt.get(_key(name, num_samples, seed, data_dir, split, image_size))
    if made is not None:
        return made
    if name.startswith(files.FOLDER):
        return files.load_folder(name[len(files.FOLDER):], split, image_size or 32).head(num_samples)
    if name.startswith(files.NPZ):
        return files.load_npz(name[len(files.NPZ):], split).head(num_samples)
    if name == "synthetic":
        n = num_samples if num_samples is not None else (10_000 if split == "train" else 2_000)
        return SyntheticImages(n, seed, split)
    if name == "cifar10":
        return load_cifar10(data_dir, split).head(num_samples)
    if name == "digits":
        from .digits import load_digits

        return load_digits(split).head(num_samples)
    raise ValueError(f"unknown dataset {name!r}; available: {', '.join(DATASETS)}")


# The sets ``prebuild`` made: the launcher's zygote builds a run's sets once before it forks the run's workers, which
# then find them here (memory shared copy-on-write; no worker writes into a set) instead of each building its own
_prebuilt: dict[str, ImageSet] = {}
_prebuilt_for = [""]  # the launch they were built for (``prebuild``)


def _key(name: str, num_samples: int | None, seed: int, data_dir, split: str, image_size: int | None) -> str:
    return json.dumps([name, num_samples, seed, None if data_dir is None else str(data_dir), split, image_size])


def prebuild(specs: list[dict], run: str = "") -> None:
    """Build each set ``specs`` names (``build_dataset``'s keyword arguments; each at most once) and keep them,
    and only them, for ``build_dataset``'s calls with the same arguments in this process and its forks (the
    launcher asks only for ``GENERATED`` sets: ``launcher.worker_datasets``). A set that cannot be built is left out:
    the process that needs it builds it and says what is wrong. Sets kept from an earlier call are used again only
    for the same ``run`` (the launch that asks)."""
    if _prebuilt_for[0] != run:
        _prebuilt.clear()
        _prebuilt_for[0] = run
    keep: dict[str, ImageSet] = {}
    for spec in specs:
        try:
            args = {"num_samples": None, "seed": 0, "data_dir": None, "split": "train", "image_size": None, **spec}
            key = _key(**args)
            made = keep.get(key, _prebuilt.get(key))
            keep[key] = made if made is not None else build_dataset(**args)
        except Exception:  # noqa: BLE001, S112 - the worker builds it again and reports the error
            continue
    _prebuilt.clear()
    _prebuilt.update(keep)
