"""Will a run fit on this machine? Checked before anything starts, from measured per-process footprints.

Every worker and server is a process of its own that imports torch, so a run's memory is about the sum
of its processes' private memory, plus torch's shared libraries once (the page cache shares them). That
sum is compared with the memory available now (MemAvailable, and a cgroup's limit where one is set). A
run that cannot fit is refused with the largest N and S that would (exit 2; ``--force`` starts it
anyway); one with many more processes than cores only gets a warning: the project's own emulated sweeps
run N = 8 workers and S = 8 servers on 2 cores, and they measure links, not the cores.

The figures: peak RssAnon per process (MiB), measured 2026-12-01 on this project's machine (2 cores,
24 GiB, no GPU, torch 2.13 CPU) with ``python benchmarks/footprint.py --steps 2`` (and
``--models ''`` for the bench's processes); rerun it where torch or the models change.
"""
from __future__ import annotations

import os
import sys

from ..config import ConfigError, TrainConfig
from ..strategies import uses_servers

MiB = 1 << 20
MODEL_BYTES = {"cnn": 2_180_392, "resnet18_narrow": 11_190_440, "resnet18": 44_695_848,  # parameters, float32,
               "resnet50": 94_114_088, "vit_b_16": 343_225_384}  # 10 classes, the model's default size
# model: (worker at batch 32, each further sample; the larger of allreduce's and ps's worker, N=2; 32 x 32)
WORKER_MIB = {"cnn": (245.1, 0.76), "resnet18_narrow": (380.7, 4.24), "resnet18": (647.7, 5.41),
              "resnet50": (695.9, 1.86), "vit_b_16": (1854.7, 2.92)}
# model: (server base, bytes per byte of the server's shard: from S=1 and S=2 at N=2)
SERVER = {"cnn": (145.2, 5.03), "resnet18_narrow": (151.1, 3.44), "resnet18": (145.2, 4.00),
          "resnet50": (153.6, 3.83), "vit_b_16": (168.9, 3.85)}
SHARED_FILES_MIB = 106.5  # the largest RssFile seen: torch's libraries, counted once per machine
# the bench's processes: (base, bytes per byte of message; SGD echo: per byte of parameters it updates)
BENCH_WORKER, ECHO, SGD_ECHO = (238.3, 7.66), (8.2, 0.63), (144.1, 4.64)
BENCH_SERVER = (max(b for b, _ in SERVER.values()), max(k for _, k in SERVER.values()))
OVERSUBSCRIBED = 4  # processes per core above which a run gets a warning


def model_bytes(model: str, cfg: TrainConfig | None = None) -> int:
    """From the table (building ResNet-18 to count would cost every launch a few hundred ms), else counted
    on the meta device (``cfg``'s classes and input size where given)."""
    if model in MODEL_BYTES and (cfg is None or (cfg.num_classes in (None, 10) and not cfg.image_size)):
        return MODEL_BYTES[model]
    from ..train.models import build_model, model_of, shapes_only

    with shapes_only():
        m = model_of(cfg) if cfg is not None else build_model(model, 0)
    return sum(p.numel() * p.element_size() for p in m.parameters())


def available_bytes() -> int | None:
    """Memory that can be used now: MemAvailable, capped by this cgroup's (v2) limit; None if unknown."""
    try:
        info = dict(line.split(":", 1) for line in open("/proc/meminfo").read().splitlines())
        avail = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        if limit != "max":
            avail = min(avail, int(limit) - int(open("/sys/fs/cgroup/memory.current").read()))
    except (OSError, ValueError):
        pass
    return avail


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def plural(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / MiB:.0f} MiB"


class Footprint:
    """A run's memory: ``need(n, s)`` bytes for n workers and s servers of one model and batch."""

    def __init__(self, model: str, batch_size: int, nbytes: int | None = None, image_size: int = 32):
        self.model, self.nbytes = model, nbytes if nbytes is not None else model_bytes(model)
        if model in WORKER_MIB:
            base, s32 = WORKER_MIB[model]
        else:  # not measured: ResNet-18's, scaled by the parameters' bytes
            (b0, _), (b1, s32) = WORKER_MIB["cnn"], WORKER_MIB["resnet18"]
            per_byte = (b1 - b0) / (MODEL_BYTES["resnet18"] - MODEL_BYTES["cnn"])  # MiB per byte of parameters
            base = b0 + per_byte * (self.nbytes - MODEL_BYTES["cnn"])
        per_sample = s32 * (image_size / 32) ** 2  # measured at 32 x 32: activations grow with the pixels
        base += (per_sample - s32) * 32  # (none when emulated: an over-estimate)
        self.worker = (base + per_sample * max(0, batch_size - 32)) * MiB  # below 32: as at 32
        server_base, self.per_byte = SERVER.get(model, BENCH_SERVER)
        self.server_base = server_base * MiB

    def servers(self, s: int) -> float:
        return s * self.server_base + (self.per_byte * self.nbytes if s else 0)  # the shards add up to the model

    def need(self, n: int, s: int) -> float:
        return SHARED_FILES_MIB * MiB + n * self.worker + self.servers(s)

    def max_workers(self, avail: float, s: int) -> int:
        return int((avail - self.need(0, s)) // self.worker)

    def max_servers(self, avail: float, n: int) -> int:
        return int((avail - self.need(n, 0) - self.per_byte * self.nbytes) // self.server_base)


def check_train(cfg: TrainConfig, force: bool = False, echo: bool = True) -> None:
    """Refuse (``ConfigError``) a run that cannot fit in the memory available; warn on oversubscribed cores."""
    n, s = cfg.workers, cfg.servers if uses_servers(cfg.sync) else 0
    fp = Footprint(cfg.model, cfg.batch_size, model_bytes(cfg.model, cfg), cfg.input_size)
    avail = available_bytes()
    check_generated(cfg, avail, force)
    if avail is not None and fp.need(n, s) > avail and not force:
        if s:
            limits = [f"--workers {k} with --servers {s}" for k in [fp.max_workers(avail, s)] if k >= 1]
            limits += [f"--servers {k} with --workers {n}" for k in [fp.max_servers(avail, n)] if k >= 1]
            limits = limits or [f"--workers {max(0, fp.max_workers(avail, 1))} with --servers 1"]
            what = f"{plural(n, 'worker')} and {plural(s, 'server')}"
            each = f"worker {gib(fp.worker)}, server {gib(fp.servers(s) / s)}"
        else:
            limits, what, each = [f"--workers {max(0, fp.max_workers(avail, 0))}"], plural(n, "worker"), gib(fp.worker)
        raise ConfigError(f"{what} of {cfg.model} (batch {cfg.batch_size}) need about {gib(fp.need(n, s))} of "
                          f"memory (measured per process: {each}), {gib(avail)} is available: this machine holds "
                          f"at most {' or '.join(limits)}; use fewer, or --force to start anyway")
    warn_cores(n + s, echo)


SYNTHETIC_SAMPLE_BYTES = 3 * 32 * 32 * 5  # datasets.SyntheticImages: its float32 noise and its uint8 images


def check_generated(cfg: TrainConfig, avail: int | None, force: bool = False) -> None:
    """Refuse a ``synthetic`` set that cannot be generated in the memory available (``--num-samples 2e9``:
    30 TB, where generating it would run for minutes before the machine runs out). Counted once: the
    launcher's zygote generates it before it forks the workers."""
    if cfg.dataset != "synthetic" or cfg.num_samples is None or avail is None or force:
        return
    need = cfg.num_samples * SYNTHETIC_SAMPLE_BYTES
    if need > avail:
        raise ConfigError(f"--num-samples {cfg.num_samples} of synthetic data need about {gib(need)} of memory to "
                          f"generate, {gib(avail)} is available: use --num-samples {avail // SYNTHETIC_SAMPLE_BYTES} "
                          f"or fewer (--force to start anyway)")


def check_bench(workers: int, sizes: list[int], servers: list[int], floor: bool, force: bool = False) -> None:
    """The bench's processes at their peak: N bench workers, and per PS group S echo servers, S psring
    servers and (``floor``) S SGD echo servers per size, which live until the group ends."""
    big, s = max(sizes), max(servers or [0])
    need = SHARED_FILES_MIB * MiB + workers * (BENCH_WORKER[0] * MiB + BENCH_WORKER[1] * big)
    if s:
        need += s * (ECHO[0] + BENCH_SERVER[0]) * MiB + (ECHO[1] + BENCH_SERVER[1]) * big
        need += (s * len(sizes) * SGD_ECHO[0] * MiB + SGD_ECHO[1] * sum(sizes)) if floor else 0
    avail = available_bytes()
    if avail is not None and need > avail and not force:
        raise ConfigError(f"the bench's {plural(workers, 'worker')} and up to {s} servers of each kind at {gib(big)} "
                          f"messages need about {gib(need)} of memory, {gib(avail)} is available; use fewer "
                          f"--workers or smaller sizes, or --force to start anyway")
    warn_cores(workers + s * (2 + (len(sizes) if floor else 0)), True)


def warn_cores(processes: int, echo: bool) -> None:
    c = cores()
    if echo and processes > OVERSUBSCRIBED * c:
        print(f"psring: warning: {processes} processes on {c} cores: they take turns on the cores, so step "
              f"times include waiting for a core (--compute emulated keeps workers off them)",
              file=sys.stderr, flush=True)
