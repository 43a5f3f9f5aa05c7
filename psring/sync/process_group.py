"""torch.distributed set-up from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
LOCAL_RANK), with the backend rule: NCCL when *every* worker has a CUDA device, gloo otherwise.

The rule needs a vote, so the default group is always gloo (it also carries the vote); when every rank
has a GPU, a second NCCL group over all ranks carries the gradients. Ranks therefore never disagree on
the backend, which would otherwise hang the first collective.
"""
from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist

from ..topology import DEVICE_ENV

# The flat collectives: torch 2.13 names them *_single and deprecates *_tensor, the only names torch 2.5-2.12
# have (a lent GPU's torch 2.11 raised AttributeError on *_single).
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass
class ProcessGroupInfo:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    backend: str
    group: object  # the process group gradients travel on (None = default group)
    timeout_s: float = 120.0  # of every collective; subgroups (``hierarchical``) get the same

    def new_group(self, ranks: list[int]):
        """A subgroup of ``ranks`` on this group's backend (every rank must call it, in the same order)."""
        return dist.new_group(ranks, timeout=datetime.timedelta(seconds=self.timeout_s),
                              backend="nccl" if self.backend == "nccl" else "gloo")


def env_rank() -> tuple[int, int, int]:
    """(RANK, WORLD_SIZE, LOCAL_RANK) from the environment; defaults describe a single process."""
    try:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError as e:
        raise RuntimeError(f"RANK/WORLD_SIZE/LOCAL_RANK must be integers: {e}") from None
    if not 0 <= rank < world:
        raise RuntimeError(f"RANK={rank} is outside 0..WORLD_SIZE-1 (WORLD_SIZE={world})")
    return rank, world, local


def local_device(local_rank: int) -> torch.device:
    """GPU ``local_rank`` if there is one (``PSRING_DEVICE_INDEX`` instead where psring's launcher put
    every worker of a run on this machine), else the CPU."""
    index = int(os.environ.get(DEVICE_ENV, local_rank))
    if torch.cuda.is_available() and torch.cuda.device_count() > index:
        return torch.device("cuda", index)
    return torch.device("cpu")


def init_process_group(backend: str = "auto", timeout_s: float = 120.0) -> ProcessGroupInfo:
    rank, world, local = env_rank()
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise RuntimeError(f"{var} is not set; start workers with `psring train` or torchrun")
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world, timeout=timeout)
    has_gpu = torch.tensor([1 if local_device(local).type == "cuda" else 0])
    dist.all_reduce(has_gpu, op=dist.ReduceOp.MIN)
    all_gpu = bool(has_gpu.item())
    if backend == "nccl" and not all_gpu:
        raise RuntimeError("--backend nccl needs a CUDA device on every worker; at least one has none")
    if backend == "nccl" or (backend == "auto" and all_gpu):
        device = local_device(local)
        torch.cuda.set_device(device)
        group = dist.new_group(backend="nccl", timeout=timeout)
        return ProcessGroupInfo(rank, world, local, device, "nccl", group, timeout_s)
    return ProcessGroupInfo(rank, world, local, torch.device("cpu"), "gloo", None, timeout_s)


def destroy_process_group(barrier: bool = False) -> None:
    """Tear down; with ``barrier``, first wait (bounded by the group's timeout) until every rank is here."""
    if dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()


def exit_without_teardown(rc: int) -> NoReturn:
    """End a process that used torch.distributed: flush, then leave without C++ static destructors.
    At interpreter teardown torch.distributed's background threads occasionally abort a finished
    process ("terminate called without an active exception", SIGABRT). Callers have written and
    closed every output by now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
