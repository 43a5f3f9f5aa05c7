"""Data sets: the CIFAR-10 binary reader (files written here in the official format), its error messages,
the digits set (skipped without scikit-learn), synthetic's held-out split, and the accuracy helper."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from psring.train.data import ShardedBatches
from psring.train.datasets import CIFAR10_URL, DATASETS, SyntheticImages, build_dataset, load_cifar10
from psring.train.evaluate import evaluate

RECORD = 3073


def write_cifar(folder, name, labels, seed=0):
    """Write ``len(labels)`` records of the binary version; returns the images (N x 3 x 32 x 32)."""
    images = np.random.default_rng(seed).integers(0, 256, size=(len(labels), 3, 32, 32), dtype=np.uint8)
    recs = np.concatenate([np.asarray(labels, np.uint8)[:, None], images.reshape(len(labels), -1)], axis=1)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(recs.tobytes())
    return images


@pytest.fixture
def cifar_dir(tmp_path):
    folder = tmp_path / "cifar-10-batches-bin"
    train = [write_cifar(folder, f"data_batch_{i}.bin", [(i + j) % 10 for j in range(20)], seed=i)
             for i in range(1, 6)]
    test = write_cifar(folder, "test_batch.bin", [j % 10 for j in range(12)], seed=9)
    return tmp_path, train, test


def test_cifar10_round_trips_pixels_and_labels(cifar_dir):
    root, train, test = cifar_dir
    ds = build_dataset("cifar10", None, 0, data_dir=root)
    assert ds.images.shape == (100, 3, 32, 32) and ds.images.dtype == np.uint8 and ds.labels.dtype == np.int64
    assert np.array_equal(ds.images, np.concatenate(train))
    assert ds.labels[:3].tolist() == [1, 2, 3] and ds.labels[20:23].tolist() == [2, 3, 4]  # file order
    # The raw record layout: byte 0 label, then the R plane, G plane, B plane, each row-major 32 x 32.
    raw = np.frombuffer((root / "cifar-10-batches-bin" / "data_batch_2.bin").read_bytes(), np.uint8)
    rec = raw[5 * RECORD:6 * RECORD]
    img = ds.images[20 + 5]
    assert rec[0] == ds.labels[25] == 7
    assert img[0, 0, 0] == rec[1] and img[0, 0, 1] == rec[2] and img[0, 1, 0] == rec[1 + 32]
    assert img[1, 0, 0] == rec[1 + 1024] and img[2, 31, 31] == rec[3072]
    assert (ds.num_classes, ds.channels, ds.size, ds.hflip) == (10, 3, 32, True)
    assert len(ds.mean) == len(ds.std) == 3
    te = load_cifar10(root, split="test")
    assert np.array_equal(te.images, test) and te.labels.tolist() == [j % 10 for j in range(12)]
    assert len(build_dataset("cifar10", 30, 0, data_dir=root)) == 30
    # the folder holding the .bin files works as well as the root it was extracted to
    assert len(load_cifar10(root / "cifar-10-batches-bin")) == 100


def test_cifar10_found_through_psring_data(cifar_dir, monkeypatch):
    root, _, _ = cifar_dir
    monkeypatch.setenv("PSRING_DATA", str(root))
    assert len(build_dataset("cifar10", split="test")) == 12


@pytest.mark.parametrize("size", [RECORD * 3 - 1, RECORD * 2 + 100, 0])
def test_cifar10_truncated_or_wrong_sized_file_is_named(cifar_dir, size):
    root, _, _ = cifar_dir
    f = root / "cifar-10-batches-bin" / "data_batch_3.bin"
    f.write_bytes(f.read_bytes()[:size] if size <= f.stat().st_size else b"\0" * size)
    with pytest.raises(ValueError, match="data_batch_3.bin") as e:
        load_cifar10(root)
    assert "\n" not in str(e.value) and "3073" in str(e.value)


def test_cifar10_label_above_9_is_refused(cifar_dir):
    root, _, _ = cifar_dir
    write_cifar(root / "cifar-10-batches-bin", "test_batch.bin", [3, 12, 4])
    with pytest.raises(ValueError, match=r"test_batch\.bin: record 1 has label 12"):
        load_cifar10(root, split="test")


def test_cifar10_missing_directory_or_file_says_what_to_download(tmp_path, cifar_dir):
    with pytest.raises(ValueError, match="binary version") as e:
        build_dataset("cifar10", None, 0, data_dir=tmp_path / "nowhere")
    msg = str(e.value)
    assert CIFAR10_URL in msg and str(tmp_path / "nowhere") in msg and "\n" not in msg
    root, _, _ = cifar_dir
    (root / "cifar-10-batches-bin" / "data_batch_4.bin").unlink()
    with pytest.raises(ValueError, match="data_batch_4.bin is missing") as e:
        load_cifar10(root)
    assert CIFAR10_URL in str(e.value)
    assert len(load_cifar10(root, split="test")) == 12  # the other split is still there


def test_digits_splits():
    pytest.importorskip("sklearn")
    tr, te = build_dataset("digits", None, 0), build_dataset("digits", None, 5, split="test")
    assert len(tr) + len(te) == 1797 and abs(len(te) - 0.2 * 1797) <= 5
    for d in (tr, te):
        assert d.images.shape[1:] == (3, 32, 32) and d.images.dtype == np.uint8 and d.labels.dtype == np.int64
        assert np.array_equal(d.images[:, 0], d.images[:, 2]) and d.images.max() > 200
        assert set(np.unique(d.labels)) == set(range(10))
        assert (d.num_classes, d.channels, d.size, d.hflip) == (10, 3, 32, False)
    assert tr.mean == te.mean and tr.std == te.std and 0 < tr.mean[0] < 1 and 0 < tr.std[0] < 1
    # stratified: every class is 20% test, within rounding
    ct, ce = np.bincount(tr.labels), np.bincount(te.labels)
    assert np.all(np.abs(ce - 0.2 * (ct + ce)) <= 0.5)
    # deterministic, independent of the seed, and disjoint
    again = build_dataset("digits", None, 1, split="test")
    assert np.array_equal(again.images, te.images) and np.array_equal(again.labels, te.labels)
    rows = {r.tobytes() for r in tr.images[:, 0]}
    assert sum(r.tobytes() in rows for r in te.images[:, 0]) <= 5  # (the raw set has a few duplicates)


def test_digits_without_sklearn_says_what_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_sklearn(name, *a, **k):
        if name == "sklearn" or name.startswith("sklearn."):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_sklearn)
    with pytest.raises(ValueError, match=r"pip install 'psring\[digits\]'"):
        build_dataset("digits", None, 0)


def test_synthetic_has_a_held_out_split_of_the_same_classes():
    tr, te = build_dataset("synthetic", 500, 3), build_dataset("synthetic", 500, 3, split="test")
    assert np.array_equal(tr.images, SyntheticImages(500, 3).images)  # train unchanged
    assert not np.array_equal(tr.images, te.images)
    assert np.array_equal(te.images, SyntheticImages(500, 3, split="test").images)
    # same prototypes: a nearest-class-mean classifier fitted on train is far above chance on test
    # (brightness removed per image), and at chance on another seed's test split (other prototypes)
    def flat(d):
        x = d.images.reshape(len(d), -1).astype(np.float32)
        return x - x.mean(1, keepdims=True)

    means = np.stack([flat(tr)[tr.labels == c].mean(0) for c in range(10)])

    def accuracy(d):
        return (((flat(d)[:, None] - means[None]) ** 2).sum(-1).argmin(1) == d.labels).mean()

    assert accuracy(te) > 0.5 and accuracy(build_dataset("synthetic", 500, 4, split="test")) < 0.25


def test_unknown_dataset_and_split_list_the_choices():
    with pytest.raises(ValueError, match="synthetic, cifar10, digits"):
        build_dataset("mnist", 10, 0)
    with pytest.raises(ValueError, match="train, test"):
        build_dataset("synthetic", 10, 0, split="val")
    assert DATASETS == ("synthetic", "cifar10", "digits")


def test_digits_augmentation_crops_but_never_flips():
    pytest.importorskip("sklearn")
    tr = build_dataset("digits", 64, 0)
    plain = ShardedBatches(tr, 0, 1, 64, seed=1)
    aug = ShardedBatches(tr, 0, 1, 64, seed=1, augment=True)
    g = torch.Generator().manual_seed(1 * 7_919 + 0)
    torch.rand(64, generator=g)
    offs = torch.randint(0, 9, (64, 2), generator=g)
    (x, _), (xa, _) = plain.get(0), aug.get(0)
    zero = (0 - plain.mean) / plain.std  # padding (black) after normalisation
    for i in range(64):
        dy, dx = int(offs[i, 0]), int(offs[i, 1])
        padded = torch.nn.functional.pad(x[i] - zero[0], (4, 4, 4, 4)) + zero[0]
        assert torch.allclose(xa[i], padded[:, dy:dy + 32, dx:dx + 32], atol=1e-5), i


def test_evaluate_counts_correct_predictions_and_restores_the_mode():
    te = build_dataset("synthetic", 50, 0, split="test")

    class Oracle(torch.nn.Module):  # answers the label of a sample whose first pixel it has memorised
        def __init__(self):
            super().__init__()
            self.lookup = {}

        def forward(self, x):
            assert not self.training
            return torch.nn.functional.one_hot(torch.tensor([self.lookup.get(round(float(v), 4), 0)
                                                             for v in x[:, 0, 0, 0]]), 10).float()

    m = Oracle()
    mean, std = ShardedBatches(te, 0, 1, 1, 0).mean, ShardedBatches(te, 0, 1, 1, 0).std
    firsts = (torch.from_numpy(te.images[:, :1, :1, :1]).float() / 255 - mean[:, :1]) / std[:, :1]
    for v, y in zip(firsts.flatten().tolist(), te.labels.tolist()):
        m.lookup.setdefault(round(v, 4), y)
    m.train()
    acc = evaluate(m, te, batch_size=7, device="cpu")
    expected = np.mean([m.lookup[round(v, 4)] == y for v, y in zip(firsts.flatten().tolist(), te.labels)])
    assert acc == pytest.approx(expected) and acc > 0.5 and m.training


def _synthetic_in_one_pass(n, seed, split):
    """``SyntheticImages`` as it was written before it worked in chunks (whole-set temporaries): the data every
    committed run with ``--dataset synthetic`` trained on."""
    rng = np.random.default_rng(seed)
    protos = rng.normal(0, 1, size=(10, 3, 4, 4)).astype(np.float32).repeat(8, axis=2).repeat(8, axis=3)
    if split == "test":
        rng = np.random.default_rng([seed, 0x7E57])
    labels = rng.integers(0, 10, size=n).astype(np.int64)
    noise = rng.standard_normal(size=(n, 3, 32, 32), dtype=np.float32)
    shift = rng.normal(0, 0.3, size=(n, 1, 1, 1)).astype(np.float32)
    noise *= 1.2
    noise += 0.1 * protos[labels]
    noise += shift
    noise *= 40
    noise += 128
    return np.clip(noise, 0, 255, out=noise).astype(np.uint8), labels


@pytest.mark.parametrize("n,seed,split", [(0, 0, "train"), (1, 5, "test"), (511, 1, "train"), (513, 2, "test"),
                                          (1500, 0, "train"), (2000, 0, "test")])
def test_synthetic_in_chunks_is_the_one_pass_set_bit_for_bit(n, seed, split):
    from psring.train.datasets import SYNTHETIC_CHUNK

    assert SYNTHETIC_CHUNK == 512  # (the sizes above straddle it)
    images, labels = _synthetic_in_one_pass(n, seed, split)
    got = SyntheticImages(n, seed, split)
    assert got.images.dtype == np.uint8 and got.images.shape == (n, 3, 32, 32)
    assert np.array_equal(got.images, images) and np.array_equal(got.labels, labels)


def test_prebuilt_sets_are_what_build_dataset_returns_for_the_same_arguments_only(tmp_path):
    """``datasets.prebuild`` (the zygote's, before it forks a run's workers): the same arguments get the set it
    made, other ones a new set; one it cannot build is left to the caller, who gets the error; each call keeps only
    the sets it names."""
    from psring.train import datasets

    try:
        datasets.prebuild([{"name": "synthetic", "num_samples": 64, "seed": 1},
                           {"name": "synthetic", "num_samples": None, "seed": 1, "split": "test"},
                           {"name": "cifar10", "data_dir": str(tmp_path / "none")},
                           {"name": "synthetic", "no_such_argument": 1}, "synthetic", {"seed": 1}])
        train = build_dataset("synthetic", 64, 1)
        assert build_dataset("synthetic", 64, 1) is train
        assert build_dataset("synthetic", None, 1, split="test") is build_dataset("synthetic", None, 1, None, "test")
        assert np.array_equal(train.images, SyntheticImages(64, 1).images)
        assert build_dataset("synthetic", 64, 2) is not build_dataset("synthetic", 64, 2)  # not asked for
        with pytest.raises(ValueError, match="CIFAR-10 not found"):
            build_dataset("cifar10", None, 0, tmp_path / "none")
        datasets.prebuild([{"name": "synthetic", "num_samples": 32, "seed": 1}])
        assert build_dataset("synthetic", 64, 1) is not train  # dropped: a zygote serving many runs keeps one
        small = build_dataset("synthetic", 32, 1)
        assert build_dataset("synthetic", 32, 1) is small
        datasets.prebuild([{"name": "synthetic", "num_samples": 32, "seed": 1}], run="the next run")
        assert build_dataset("synthetic", 32, 1) is not small  # each run's own
    finally:
        datasets.prebuild([])
