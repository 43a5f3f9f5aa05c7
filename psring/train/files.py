"""A user's own images: ``--dataset folder:DIR`` (torchvision's ImageFolder layout) and ``--dataset npz:FILE``.

``folder:DIR``: one sub-folder per class (their sorted names are the labels 0, 1, ...), each holding image
files Pillow reads. With ``DIR/train`` (and ``DIR/test`` or ``DIR/val``) those are the splits; otherwise the
held-out split is 20% of every class, the same whatever the training seed (``digits.split_indices``).
Images are decoded when a batch needs them, never all at once (10,000 images of 224x224 would be 1.5 GB
per worker): RGB, the shorter side resized to the run's input size, the centre cropped square (torchvision's
``Resize`` + ``CenterCrop``); normalised with ImageNet's statistics (a folder's own would need a pass
over every image before the first step).

``npz:FILE``: pre-decoded arrays: ``images`` (uint8, N x 3 x H x W or N x H x W x 3) and ``labels``
(integers from 0), or ``train_images``/``train_labels`` with ``test_images``/``test_labels``; optional
``mean`` and ``std`` (3 values each, of pixels in [0, 1]; default the train split's own).

Every problem (no such folder, no class folder, a class folder without images, an image Pillow cannot read,
arrays of mismatched shapes) is one ValueError line naming the file, raised by ``check`` before any
process starts.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from .datasets import ImageSet, _check_split

FOLDER, NPZ = "folder:", "npz:"
EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def is_files(name: str) -> bool:
    return name.startswith((FOLDER, NPZ))


def decode(path: Path, side: int) -> np.ndarray:
    """One image as 3 x side x side uint8: RGB, shorter side resized to ``side`` (bilinear), centre crop."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            w, h = im.size
            scale = side / min(w, h)
            nw, nh = max(side, round(w * scale)), max(side, round(h * scale))
            if (nw, nh) != (w, h):
                im = im.resize((nw, nh), Image.BILINEAR)
            left, top = (nw - side) // 2, (nh - side) // 2
            im = im.crop((left, top, left + side, top + side))
            return np.asarray(im, dtype=np.uint8).transpose(2, 0, 1)
    except Exception as e:  # noqa: BLE001 - Pillow raises many kinds; one line naming the file
        raise ValueError(f"cannot read image {path}: {type(e).__name__}: {e}") from None


class FolderArray:
    """The images of a list of files as a lazy N x 3 x side x side uint8 array: indexing decodes."""

    def __init__(self, files: list[Path], side: int):
        self.files, self.side = files, side

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return len(self.files), 3, self.side, self.side

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, idx) -> np.ndarray | FolderArray:
        if isinstance(idx, slice):
            return FolderArray(self.files[idx], self.side)
        picked = np.atleast_1d(np.asarray(idx))
        out = np.empty((len(picked), 3, self.side, self.side), dtype=np.uint8)
        for i, j in enumerate(picked):
            out[i] = decode(self.files[int(j)], self.side)
        return out if np.ndim(idx) else out[0]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """Every image decoded (``np.asarray`` of a slice: an evaluation batch)."""
        out = self[np.arange(len(self))]
        return out if dtype is None else out.astype(dtype)


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in EXTENSIONS)


def _classes(root: Path) -> tuple[list[str], list[Path], np.ndarray]:
    """(class names, files, labels) of one ImageFolder tree."""
    names = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not names:
        raise ValueError(f"{root} has no class folders: --dataset folder:DIR needs DIR/<class>/<image> files")
    files, labels = [], []
    for k, name in enumerate(names):
        got = _images_in(root / name)
        if not got:
            raise ValueError(f"class folder {root / name} has no images (files ending in "
                             f"{', '.join(EXTENSIONS)})")
        files += got
        labels += [k] * len(got)
    return names, files, np.asarray(labels, dtype=np.int64)


@functools.lru_cache(maxsize=8)
def scan_folder(root: str) -> dict:
    """{"classes": names, "train": (files, labels), "test": (files, labels)} of folder ``root``."""
    from .digits import split_indices

    path = Path(root).expanduser()
    if not path.is_dir():
        raise ValueError(f"--dataset folder:{root}: no such folder")
    if (path / "train").is_dir():
        held = next((path / d for d in ("test", "val") if (path / d).is_dir()), None)
        if held is None:
            raise ValueError(f"{path} has train/ but no test/ or val/ beside it (or drop train/: 20% of every "
                             f"class is then held out)")
        names, files, labels = _classes(path / "train")
        test_names, test_files, test_labels = _classes(held)
        if test_names != names:
            raise ValueError(f"{held}'s class folders differ from {path / 'train'}'s: {test_names} vs {names}")
        return {"classes": names, "train": (files, labels), "test": (test_files, test_labels)}
    names, files, labels = _classes(path)
    train, test = split_indices(labels)
    return {"classes": names, "train": ([files[i] for i in train], labels[train]),
            "test": ([files[i] for i in test], labels[test])}


def load_folder(root: str, split: str, side: int) -> ImageSet:
    _check_split(split)
    scan = scan_folder(root)
    files, labels = scan[split]
    return ImageSet(FolderArray(files, side), labels, name=f"{FOLDER}{root}", split=split, mean=IMAGENET_MEAN,
                    std=IMAGENET_STD, num_classes=len(scan["classes"]))


@functools.lru_cache(maxsize=4)
def _npz(path: str) -> dict:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"--dataset npz:{path}: no such file")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"cannot read {p} as .npz: {type(e).__name__}: {e}") from None
    if "train_images" in arrays:
        keys = {"train": ("train_images", "train_labels"), "test": ("test_images", "test_labels")}
    elif "images" in arrays:
        keys = None
    else:
        raise ValueError(f"{p} has neither 'images' and 'labels' nor 'train_images'/'train_labels' arrays "
                         f"(it has: {', '.join(arrays) or 'none'})")
    out = {}
    for split in ("train", "test"):
        xk, yk = keys[split] if keys else ("images", "labels")
        if xk not in arrays or yk not in arrays:
            raise ValueError(f"{p}: missing array {xk if xk not in arrays else yk!r}")
        out[split] = _checked(p, xk, arrays[xk], arrays[yk])
    if keys is None:
        from .digits import split_indices

        (x, y) = out["train"]
        train, test = split_indices(y)
        out = {"train": (x[train], y[train]), "test": (x[test], y[test])}
    x = out["train"][0]
    pixels = x.astype(np.float32) / 255
    mean = tuple(np.asarray(arrays["mean"], dtype=np.float64)) if "mean" in arrays else pixels.mean((0, 2, 3))
    std = tuple(np.asarray(arrays["std"], dtype=np.float64)) if "std" in arrays else pixels.std((0, 2, 3))
    if len(mean) != 3 or len(std) != 3:
        raise ValueError(f"{p}: 'mean' and 'std' need 3 values each (one per channel)")
    out["mean"], out["std"] = tuple(float(v) for v in mean), tuple(max(float(v), 1e-6) for v in std)
    out["classes"] = int(max(out["train"][1].max(), out["test"][1].max())) + 1
    return out


def _checked(p: Path, key: str, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if x.ndim != 4:
        raise ValueError(f"{p}: {key!r} has shape {x.shape}; expected N x 3 x H x W or N x H x W x 3")
    if x.shape[1] != 3 and x.shape[-1] == 3:
        x = x.transpose(0, 3, 1, 2)
    if x.shape[1] != 3 or x.shape[2] != x.shape[3]:
        raise ValueError(f"{p}: {key!r} has shape {x.shape}; expected square RGB images (3 channels)")
    if x.dtype != np.uint8:
        raise ValueError(f"{p}: {key!r} is {x.dtype}; expected uint8 pixels 0..255")
    if y.ndim != 1 or len(y) != len(x):
        raise ValueError(f"{p}: {len(x)} images but labels of shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
        raise ValueError(f"{p}: labels must be integers from 0, got {y.dtype} from {y.min() if len(y) else '-'}")
    if len(x) == 0:
        raise ValueError(f"{p}: {key!r} holds no images")
    return np.ascontiguousarray(x), y.astype(np.int64)


def load_npz(path: str, split: str) -> ImageSet:
    _check_split(split)
    d = _npz(path)
    x, y = d[split]
    return ImageSet(x, y, name=f"{NPZ}{path}", split=split, mean=d["mean"], std=d["std"], num_classes=d["classes"])


def classes(name: str) -> int:
    """The classes of ``folder:DIR`` or ``npz:FILE``."""
    return len(scan_folder(name[len(FOLDER):])["classes"]) if name.startswith(FOLDER) else _npz(name[len(NPZ):])["classes"]


def check(name: str) -> None:
    """Every problem now, in one line: the layout, and (folder) that Pillow opens every image."""
    if name.startswith(NPZ):
        _npz(name[len(NPZ):])
        return
    from PIL import Image

    scan = scan_folder(name[len(FOLDER):])
    for split in ("train", "test"):
        for f in scan[split][0]:
            try:
                with Image.open(f) as im:
                    im.verify()
            except Exception as e:  # noqa: BLE001
                raise ValueError(f"cannot read image {f}: {type(e).__name__}: {e}") from None
