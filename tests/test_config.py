"""Each option declared once: every field has its declaration and its flag, the CLI's defaults are
TrainConfig's, config.json keeps its shape (committed runs still count as finished), and the refusals
derived from the strategy registry are one line."""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from psring import strategies
from psring.cli import build_parser, config_from_args
from psring.config import OVERLAPS, SECTIONS, ConfigError, OptimConfig, TrainConfig, section_titles
from psring.options import declared, undeclared
from psring.sweep import is_finished

ROOT = Path(__file__).resolve().parents[1]
# config.json's keys, in order: committed runs are compared against new configs (sweep.is_finished)
KEYS = ["sync", "workers", "servers", "model", "dataset", "num_samples", "data_dir", "partition", "batch_size",
        "steps", "seed", "augment", "optim", "threads", "backend", "timeout_s", "log_every", "warmup", "trace",
        "bucket_mb", "first_bucket_mb", "overlap", "frame_kb", "ps_window", "ps_credit_mb", "ps_order", "consistency", "staleness",
        "ps_design", "curve", "checkpoint_every", "resume", "straggler", "eval", "net", "link_rate",
        "server_link_rate", "link_delay", "compute", "out", "ps_addrs",
        "compress", "error_feedback", "ps_placement", "workers_per_host", "link_sample_ms", "epochs", "link_burst", "link_cc", "link_tuning",
        "image_size", "num_classes", "buffers"]
OPTIM_KEYS = ["lr", "momentum", "weight_decay", "name", "betas", "eps"]


def parse(*args: str, command: str = "train") -> TrainConfig:
    return config_from_args(build_parser().parse_args([command, *args]))


def flags_of(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "cmd").choices[command]
    return {s for a in sub._actions for s in a.option_strings}


def test_every_field_has_its_declaration_and_a_flag():
    assert undeclared(TrainConfig) == []
    decls = list(declared(TrainConfig))
    paths = {d.path for d in decls}
    assert paths == {(f.name,) for f in dataclasses.fields(TrainConfig) if f.name != "optim"} | \
        {("optim", f.name) for f in dataclasses.fields(OptimConfig)}
    flags = {c: flags_of(c) for c in ("train", "worker")}
    for d in decls:
        assert d.option.help and d.option.section in SECTIONS, d.path
        assert d.option.commands, d.path
        for command in d.option.commands:
            assert d.flag in flags[command], (d.path, command)
    assert len({d.flag for d in decls}) == len(decls)  # no flag declared twice


def test_the_old_flags_and_aliases_are_kept():
    old = {"--sync", "--workers", "-n", "--servers", "-s", "--model", "--dataset", "--num-samples", "--data-dir",
           "--partition", "--no-eval", "--batch-size", "-b", "--steps", "--lr", "--momentum", "--weight-decay",
           "--optimizer", "--consistency", "--staleness", "--ps-design", "--straggler", "--curve",
           "--checkpoint-every", "--resume", "--seed", "--augment", "--threads", "--backend", "--timeout",
           "--warmup", "--log-every", "--bucket-mb", "--first-bucket-mb", "--frame-kb", "--ps-window",
           "--no-overlap", "--trace", "--net", "--link-rate", "--server-link-rate", "--link-delay", "--compute",
           "--out"}
    assert old <= flags_of("train")
    assert old | {"--ps-addrs", "--config"} <= flags_of("worker")
    assert {"--overwrite", "--force", "--max-restarts"} <= flags_of("train")


def test_help_reads_by_section_and_the_strategies_come_from_the_registry():
    sub = next(a for a in build_parser()._actions if a.dest == "cmd").choices["train"]
    text = "".join(sub.format_help().split())  # argparse wraps lines, also at hyphens
    for title in section_titles().values():
        assert "".join(title.split()) + ":" in text
    assert "parameterserver(--sync" in text
    for n in strategies.names():
        assert "".join(strategies.get(n).help.split()) in text


def test_the_cli_defaults_are_trainconfigs():
    want = TrainConfig().validate().to_dict()
    assert parse().to_dict() == want
    assert parse(command="worker").to_dict() == want


def test_config_json_keeps_its_keys_and_round_trips():
    for cfg in (TrainConfig().validate(), parse("--sync", "ps", "--servers", "2", "--workers", "2",
                                                "--consistency", "ssp", "--betas", "0.8", "0.99")):
        d = cfg.to_dict()
        assert list(d) == KEYS and list(d["optim"]) == OPTIM_KEYS
        back = TrainConfig.from_dict(json.loads(json.dumps(d)))
        assert back == cfg and back.to_dict() == d


def committed_configs() -> list[str]:
    out = subprocess.run(["git", "ls-files", "results/*config.json"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.split()


def test_every_committed_run_still_loads_and_counts_as_finished(tmp_path):
    paths = committed_configs()
    assert any(p.startswith("results/bandwidth/") for p in paths)
    for path in paths:
        cfg = TrainConfig.load(ROOT / path).validate()  # validation changes none of its values
        shutil.copy(ROOT / path, tmp_path / "config.json")
        (tmp_path / "summary.json").write_text("{}")
        assert is_finished(tmp_path, cfg), path


def one_line_error(*args: str) -> str:
    with pytest.raises(ConfigError) as e:
        parse(*args)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("args,needle", [
    (["--sync", "gossip"], "--sync must be one of"),
    (["--staleness", "-1", "--sync", "ps"], "staleness"),
    (["--sync", "ps", "--ps-design", "aggregate", "--consistency", "ssp"], "needs --consistency bsp"),
    (["--sync", "ps", "--servers", "600000"], "600000 servers for 545098 parameter elements"),
    (["--sync", "ps", "--servers", "0"], "--servers must be >= 1"),
    (["--betas", "0.9", "1.0"], "--betas must be two numbers in [0, 1)"),
    (["--compute", "emulated:0"], "positive number of milliseconds"),
    (["--compute", "emulated:inf"], "finite positive number of milliseconds, got 'inf'"),
    (["--straggler", "1:3"], "rank must be in 0..0"),
    (["--workers", "2", "--straggler", "1:inf"], "factor a finite number >= 1"),
])
def test_refusals_are_one_line(args, needle):
    assert needle in one_line_error(*args)


# a value off the default for every option of the ps section
OFF = {"servers": 2, "ps_addrs": ["tcp://127.0.0.1:1"], "frame_kb": 0, "ps_window": 1, "ps_credit_mb": 1.0, "ps_order": "priority",
       "consistency": "ssp",
       "staleness": 3, "ps_design": "aggregate", "curve": "keys", "ps_placement": "colocated"}


@pytest.mark.parametrize("sync", [n for n in strategies.names() if "ps" not in strategies.get(n).options])
def test_the_ps_options_are_refused_for_a_strategy_without_servers(sync):
    assert not strategies.get(sync).servers
    for d in declared(TrainConfig):
        if d.option.section == "ps":
            with pytest.raises(ConfigError, match=rf"^{d.flag} only applies to --sync ps \(got --sync {sync} "):
                TrainConfig(sync=sync, **{d.name: OFF[d.name]}).validate()
    assert "--servers only applies to --sync ps" in one_line_error("--sync", sync, "--servers", "2")


@pytest.mark.parametrize("mode", ["none", "full"])
@pytest.mark.parametrize("sync", [n for n in strategies.names() if strategies.get(n).overlaps != OVERLAPS])
def test_an_overlap_mode_is_refused_where_it_cannot_be_honoured(sync, mode):
    if mode in strategies.get(sync).overlaps:
        pytest.skip(f"{sync} honours --overlap {mode}")
    msg = one_line_error("--sync", sync, "--overlap", mode)
    alt = next(n for n in strategies.where(cost_model=strategies.get(sync).cost_model)
               if mode in strategies.get(n).overlaps)
    assert msg.startswith(f"--overlap {mode}") and f"use --sync {alt} --overlap {mode}" in msg
    assert parse("--sync", alt, "--overlap", mode).overlap == mode
    assert one_line_error("--sync", sync, "--no-overlap") == one_line_error("--sync", sync, "--overlap", "none")


def test_overlap_modes_and_the_old_switch():
    """--no-overlap is --overlap none; configs written with a bool read back as the mode they meant; full
    needs BSP (the next forward waits for this step's parameters)."""
    assert parse("--no-overlap").overlap == "none" and parse().overlap == "backward"
    assert TrainConfig(overlap=False).overlap == "none" and TrainConfig(overlap=True).overlap == "backward"
    assert TrainConfig.from_dict({**TrainConfig().to_dict(), "overlap": False}).overlap == "none"
    msg = one_line_error("--sync", "ps", "--consistency", "asp", "--overlap", "full")
    assert msg.startswith("--overlap full needs --consistency bsp")
    assert "must be one of none, backward, full" in one_line_error("--overlap", "sometimes")


@pytest.mark.parametrize("sync", strategies.names())
def test_the_default_bucket_is_the_strategys(sync):
    assert TrainConfig(sync=sync).validate().bucket_mb == strategies.get(sync).bucket_mb
    assert TrainConfig(sync=sync, bucket_mb=2.0).validate().bucket_mb == 2.0


def test_validating_a_config_allocates_no_model(monkeypatch):
    """The PS's shard plan builds the model, shapes only, where ``resources.MODEL_BYTES`` does not count it (another
    number of classes); a built-in model is otherwise not built to check it (``config_choices.side_problem``:
    tests/test_models.py), a factory is, shapes only too."""
    import torch

    from psring.train import models

    real, built = models.build_model, []

    def build(name, seed, *args):
        assert torch.get_default_device().type == "meta", "validation built a model on a real device"
        model = real(name, seed, *args)
        built.append({p.device.type for p in model.parameters()})
        return model

    monkeypatch.setattr(models, "build_model", build)
    TrainConfig(sync="ps", workers=8, servers=8, model="resnet18").validate()
    assert built == []
    TrainConfig(sync="ps", workers=8, servers=8, model="resnet18", num_classes=100).validate()
    assert built == [{"meta"}]
    built.clear()
    TrainConfig(sync=strategies.where(servers=False)[0]).validate()
    assert built == []
    TrainConfig(sync=strategies.where(servers=False)[0], model="tests.real_code_models:tied_frozen").validate()
    assert built == [{"meta"}]


def test_a_ps_launch_checks_its_shard_plan_without_importing_torch_for_a_built_in_model():
    """``config_checks.param_spaces``: a built-in model at ``resources.MODEL_BYTES``'s settings is one float32 space
    of the elements its meta-built layout holds, so checking a PS config imports no torch (3-4 s of CPU a launch);
    other classes build it; too many servers for its elements is refused either way."""
    import sys

    import torch

    from psring.config_checks import param_spaces
    from psring.launch.resources import MODEL_BYTES
    from psring.sync.buckets import flat_layout, space_sizes
    from psring.train.models import model_of

    code = ("import sys; from psring.config import TrainConfig; "
            "TrainConfig(sync='ps', workers=2, servers=2).validate(); print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip() == "False"
    for model in MODEL_BYTES:
        for classes in (None, 11):
            cfg = TrainConfig(sync="ps", model=model, num_classes=classes)
            with torch.device("meta"):
                spaces, itemsizes = space_sizes(flat_layout(model_of(cfg, seed=0).named_parameters()))
            assert param_spaces(cfg) == ([[sum(spaces[0])]] if classes is None else spaces, itemsizes), model
    for classes in (None, 11):
        total = sum(sum(s) for s in param_spaces(TrainConfig(sync="ps", model="cnn", num_classes=classes))[0])
        with pytest.raises(ConfigError, match=f"{total + 1} servers for {total} parameter elements"):
            TrainConfig(sync="ps", model="cnn", num_classes=classes, workers=1, servers=total + 1).validate()


def test_link_rates_are_read_as_the_replay_reads_them_on_any_net():
    """Bit and byte rates (``costmodel.Link.from_rate``), finite and above 0; a typo is one line, not a value in
    config.json (the emulated links' tc takes the bit units, and says so when they are built)."""
    for ok in ("100mbit", "1gbit", "2.5GB/s", "1e3mbit"):
        TrainConfig(link_rate=ok, server_link_rate=ok).validate()
    for bad in ("10xbit", "0mbit", "", "9" * 400 + "gbit"):
        with pytest.raises(ConfigError, match="--link-rate must be a number and a unit above 0"):
            TrainConfig(link_rate=bad).validate()
