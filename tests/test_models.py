"""The models (train/models.py, resnet.py, vit.py, factory.py): torchvision's parameter counts, output
shapes at any input size the architecture takes, a user's factory, and one-line refusals."""
from __future__ import annotations

import sys

import pytest
import torch

from psring.config import CIFAR_SIZE, IMAGENET_MODELS, IMAGENET_SIZE, MODELS, ConfigError, TrainConfig
from psring.config_choices import MODEL_SIDES
from psring.train import models
from psring.train.models import build_model, default_image_size

# torchvision 0.2x: sum(p.numel() for p in resnet50().parameters()), likewise vit_b_16
TORCHVISION_PARAMS = {"resnet50": 25_557_032, "vit_b_16": 86_567_656}


def count(name: str, classes: int = 1000, size: int | None = None) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(name, 0, classes, size).parameters())


@pytest.mark.parametrize("name", sorted(TORCHVISION_PARAMS))
def test_parameter_counts_are_torchvisions(name):
    assert count(name) == TORCHVISION_PARAMS[name]


@pytest.mark.parametrize("factory,params,side", [("resnet101", 44_549_160, 32), ("vgg16", 138_357_544, 32),
                                                ("inception_v3", 23_834_568, 75)])
def test_the_zoos_models_have_torchvisions_counts_and_run(factory, params, side):
    """``psring.train.zoo`` (the published results' models, as factories): torchvision's resnet101, vgg16 and
    inception_v3 (aux_logits=False) parameter counts, and a forward and backward at the smallest input they take."""
    with torch.device("meta"):
        assert sum(p.numel() for p in build_model(f"psring.train.zoo:{factory}", 0).parameters()) == params
    m = build_model(f"psring.train.zoo:{factory}", 0)
    out = m(torch.randn(2, 3, side, side))
    assert out.shape == (2, 1000)
    out.sum().backward()
    assert all(p.grad is not None for p in m.parameters())


def test_inception_v3_with_its_auxiliary_head_has_torchvisions_full_count():
    """torchvision's inception_v3 (aux_logits=True, its default) has 27,161,264 parameters: the zoo's layout
    is torchvision's, the auxiliary classifier included when asked for."""
    from psring.train.inception import Inception3

    with torch.device("meta"):
        m = Inception3(1000, aux_logits=True)
    assert sum(p.numel() for p in m.parameters()) == 27_161_264
    assert [n for n, _ in m.named_children()][:3] == ["Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3"]


def test_the_config_knows_the_models_and_their_sizes():
    """config.py is torch-free, so it keeps its own copy of the names and default sizes: they must agree."""
    assert MODELS == tuple(models.MODELS)
    for name in MODELS:
        want = IMAGENET_SIZE if name in IMAGENET_MODELS else CIFAR_SIZE
        assert default_image_size(name) == want == TrainConfig(model=name).input_size


@pytest.mark.parametrize("name,size", [("resnet50", 32), ("resnet50", 64), ("vit_b_16", 32), ("vit_b_16", 48),
                                       ("resnet18", 64), ("cnn", 48)])
def test_any_input_size_the_architecture_takes(name, size):
    m = build_model(name, 0, 7, size)
    out = m(torch.randn(2, 3, size, size))
    assert out.shape == (2, 7)
    out.sum().backward()
    assert all(p.grad is not None for p in m.parameters())


@pytest.mark.parametrize("name", MODELS)
def test_every_side_the_config_lets_through_builds_and_the_check_needs_no_torch(name):
    """config_checks.check_model passes a built-in model on ``side_problem`` alone, without building it: every
    side it lets through must build (the smallest few, on the meta device), one step below the least must not
    validate, and validating a built-in model's run must not import torch (the launcher's ~2 s a run)."""
    import subprocess

    k, least = MODEL_SIDES[name]
    for side in (least, least + k, 2 * least + k):
        TrainConfig(model=name, image_size=side).validate()
        with torch.device("meta"):
            build_model(name, 0, 10, side)
    for side in {least - 1, least + k - 1} - {least, least + k}:
        if side >= 4:  # --image-size's own least
            with pytest.raises(ConfigError):
                TrainConfig(model=name, image_size=side).validate()
    code = (f"import sys; from psring.config import TrainConfig; TrainConfig(model={name!r}).validate(); "
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "False", (r.stdout, r.stderr[-2000:])


def test_vit_position_embeddings_follow_the_input_size():
    with torch.device("meta"):
        assert build_model("vit_b_16", 0, 10, 64).pos_embedding.shape == (1, 17, 768)
    assert count("vit_b_16", 1000, 64) == TORCHVISION_PARAMS["vit_b_16"] - (197 - 17) * 768


def test_the_same_seed_builds_the_same_weights():
    a, b = build_model("vit_b_16", 3, 10, 32), build_model("vit_b_16", 3, 10, 32)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    # the encoder's layers are not copies of one another
    layers = a.encoder.layers
    assert not torch.equal(layers[0].linear1.weight, layers[1].linear1.weight)


@pytest.mark.parametrize("argv,msg", [
    (dict(model="vit_b_16", image_size=40), "--image-size 40 does not fit --model vit_b_16: it takes a multiple of 16"),
    (dict(model="resnet50", image_size=16), "it takes a multiple of 1, at least 32"),
    (dict(model="alexnet"), "must be one of cnn"),
    (dict(model="no_such_module_xyz:make"), "cannot import no_such_module_xyz"),
    (dict(model="json:nothing_here"), "json has no callable 'nothing_here'"),
    (dict(model="json:dumps"), "dumps() raised TypeError"),
    (dict(model="os:getcwd"), "getcwd() returned a str, not a torch.nn.Module"),
    (dict(model="bad spec:x"), "a factory is PACKAGE.MODULE:FUNCTION"),
    (dict(num_classes=5), "--num-classes 5 is below the data set's 10 classes"),
])
def test_bad_models_are_one_line(argv, msg):
    with pytest.raises(ConfigError, match=None) as e:
        TrainConfig(**argv).validate()
    assert msg in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_factory_of_the_users_own(tmp_path, monkeypatch):
    (tmp_path / "user_nets.py").write_text(
        "import torch\n"
        "def make():\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))\n")
    monkeypatch.chdir(tmp_path)  # found in the current folder, as uvicorn's module:app
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    cfg = TrainConfig(model="user_nets:make").validate()
    a, b = build_model(cfg.model, 1), build_model(cfg.model, 1)
    assert torch.equal(a[1].weight, b[1].weight)  # seeded: every worker builds the same weights
    assert not torch.equal(a[1].weight, build_model(cfg.model, 2)[1].weight)


@pytest.mark.parametrize("name,lr", [("resnet50", 0.01), ("vit_b_16", 0.01)])
def test_the_imagenet_models_train(name, lr):
    """On 32 samples of the learnable synthetic set at 32x32, the loss falls by half within 12 steps."""
    from psring.train.data import ShardedBatches
    from psring.train.datasets import build_dataset

    torch.manual_seed(0)
    batches = ShardedBatches(build_dataset("synthetic", 32, 0), 0, 1, 32, 0, image_size=32)
    x, y = batches.get(0)
    m = build_model(name, 0, 10, 32)
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9)
    losses = []
    for _ in range(12):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_shapes_only_builds_every_model_as_a_real_build_would_without_torch_dynamo():
    """``models.shapes_only`` (the launcher's checks count parameters with it): the same names, shapes, dtypes and
    trainable flags as a real build, for every built-in model and a zoo factory, in a process that then has not
    imported torch._dynamo (torch's meta kernel of ``normal_`` imports it: 2-3 s of CPU per launch)."""
    code = """if True:
        import sys, torch
        from psring.train.models import MODELS, build_model, shapes_only
        def facts(m):
            return [(n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in m.named_parameters()]
        for name in [*MODELS, "psring.train.zoo:inception_v3"]:
            with shapes_only():
                meta = build_model(name, 0, 10, 75 if "inception" in name else 32)
            assert all(p.is_meta for p in meta.parameters()), name
            assert facts(meta) == facts(build_model(name, 0, 10, 75 if "inception" in name else 32)), name
        assert "torch._dynamo" not in sys.modules
        with torch.device("meta"):
            torch.empty(3).normal_()  # (what shapes_only skips: without it, it is imported)
        assert "torch._dynamo" in sys.modules
    """
    import subprocess

    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
