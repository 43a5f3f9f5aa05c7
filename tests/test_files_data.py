"""A user's own images (train/files.py): an ImageFolder tree of PNG or JPEG files trains as the same images
given as an .npz file do, and every bad input is one line, exit 2, before any worker starts."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from psring.config import ConfigError, TrainConfig
from psring.train.datasets import build_dataset
from psring.train.files import IMAGENET_MEAN, IMAGENET_STD

CLASSES, PER_CLASS, HELD, SIDE = 4, 24, 8, 16


def images(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Four classes told apart by colour and a stripe, with noise: N x 3 x SIDE x SIDE uint8 per split."""
    rng = np.random.default_rng(seed)
    base = rng.integers(40, 215, size=(CLASSES, 3, 1, 1))
    out = {}
    for split, n in (("train", PER_CLASS), ("test", HELD)):
        y = np.repeat(np.arange(CLASSES), n)
        x = base[y] + rng.normal(0, 30, size=(len(y), 3, SIDE, SIDE))
        for k in range(CLASSES):
            x[y == k, :, :, 4 * k:4 * k + 2] += 60
        out[split] = (np.clip(x, 0, 255).astype(np.uint8), y)
    return out


def write_folder(root, data, ext: str = ".png") -> None:
    for split, (x, y) in data.items():
        for i, (img, label) in enumerate(zip(x, y)):
            d = root / split / f"class_{label}"
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img.transpose(1, 2, 0)).save(d / f"{i:03d}{ext}", quality=95)


def test_a_png_folder_decodes_to_exactly_its_pixels(tmp_path):
    data = images()
    write_folder(tmp_path / "f", data)
    got = build_dataset(f"folder:{tmp_path / 'f'}", split="train", image_size=SIDE)
    assert len(got) == CLASSES * PER_CLASS and got.num_classes == CLASSES and got.images.shape[1:] == (3, SIDE, SIDE)
    order = np.argsort(data["train"][1], kind="stable")  # files sort by class folder, then name
    np.testing.assert_array_equal(got.images[np.arange(len(got))], data["train"][0][order])
    np.testing.assert_array_equal(got.labels, data["train"][1][order])
    assert build_dataset(f"folder:{tmp_path / 'f'}", split="train", image_size=8).images[[0]].shape == (1, 3, 8, 8)


def train(psring, tmp_path, name: str, dataset: str) -> dict:
    out = tmp_path / name
    r = psring.run("train", "--sync", "allreduce", "--workers", "2", "--model", "cnn", "--image-size", str(SIDE),
                   "--dataset", dataset, "--batch-size", "8", "--epochs", "5", "--lr", "0.02", "--out", str(out),
                   timeout=240)
    assert r.returncode == 0, r.stderr
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("ext", [".png", ".jpg"])
def test_a_folder_trains_as_its_npz(psring, tmp_path, ext):
    data = images()
    write_folder(tmp_path / "f", data, ext)
    if ext == ".png":  # the npz holds the same pixels: the same run to the bit
        order = {s: np.argsort(y, kind="stable") for s, (_, y) in data.items()}
        np.savez(tmp_path / "d.npz", mean=IMAGENET_MEAN, std=IMAGENET_STD,  # a folder's statistics
                 **{f"{s}_{k}": v[order[s]] for s, (x, y) in data.items() for k, v in (("images", x), ("labels", y))})
        a = train(psring, tmp_path, "folder", f"folder:{tmp_path / 'f'}")
        b = train(psring, tmp_path, "npz", f"npz:{tmp_path / 'd.npz'}")
        assert a["final_test_acc"] == b["final_test_acc"] and a["final_loss"] == pytest.approx(b["final_loss"], 1e-6)
    else:  # JPEG is lossy: close to the lossless run, and well above chance
        a = train(psring, tmp_path, "folder", f"folder:{tmp_path / 'f'}")
    assert a["final_test_acc"] >= 0.9, a["final_test_acc"]


def bad_cases(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "noimg" / "cat").mkdir(parents=True)
    (tmp_path / "noimg" / "dog").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "noimg" / "cat" / "a.png")
    (tmp_path / "broken" / "cat").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "broken" / "cat" / "a.png")
    (tmp_path / "broken" / "cat" / "b.png").write_bytes(b"not a png")
    np.savez(tmp_path / "shapes.npz", images=np.zeros((5, 3, 8, 8), np.uint8), labels=np.zeros(4, np.int64))
    np.savez(tmp_path / "nokeys.npz", x=np.zeros(3))
    return [
        (f"folder:{tmp_path / 'missing'}", "no such folder"),
        (f"folder:{tmp_path / 'empty'}", "has no class folders"),
        (f"folder:{tmp_path / 'noimg'}", f"class folder {tmp_path / 'noimg' / 'dog'} has no images"),
        (f"folder:{tmp_path / 'broken'}", f"cannot read image {tmp_path / 'broken' / 'cat' / 'b.png'}"),
        (f"npz:{tmp_path / 'shapes.npz'}", "5 images but labels of shape (4,)"),
        (f"npz:{tmp_path / 'nokeys.npz'}", "has neither 'images' and 'labels'"),
        ("imagenet", "must be one of synthetic"),
    ]


def test_bad_data_is_one_line(tmp_path):
    for dataset, msg in bad_cases(tmp_path):
        with pytest.raises(ConfigError) as e:
            TrainConfig(dataset=dataset, steps=1).validate()
        assert msg in str(e.value) and "\n" not in str(e.value), (dataset, str(e.value))


def test_bad_data_exits_2_before_any_worker(psring, tmp_path):
    dataset, msg = bad_cases(tmp_path)[3]  # the unreadable image
    out = tmp_path / "run"
    r = psring.run("train", "--dataset", dataset, "--steps", "1", "--out", str(out), timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and msg in lines[0], r.stderr
    assert not (out / "ranks").exists()  # refused before any worker started
