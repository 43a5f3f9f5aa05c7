"""The training loop every strategy shares. It talks to the strategy only through ``Synchronizer``.

Launch (see README): ``psring train ...`` starts everything on this machine; on several hosts start
``psring worker`` with torchrun, e.g.::

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST0:29500 --rdzv-id r18 \\
        -m psring worker --sync allreduce --workers 4 --workers-per-host 2 --model resnet18 --out runs/r18
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..collector import freeze_setup_objects
from ..config import TrainConfig
from ..fileio import CAUSES, describe, torch_save_atomic, write_atomic
from ..metrics.cpu import cpu_times
from ..metrics.steps import PhaseClock, StepLog, StepRecord
from ..metrics.wire import WireCounter
from ..sync import make_synchronizer
from ..sync.buffer_sync import BufferSync, make_buffer_sync
from ..sync.process_group import destroy_process_group, env_rank
from ..sync.ps.colocated import stop_started
from . import checkpoint
from .compute_spec import parse_compute
from .data import ShardedBatches, build_dataset
from .emulation import EmulatedCompute
from .evaluate import evaluate
from .models import model_of
from .torchrun import gather_records, launched_by_psring


def train(cfg: TrainConfig) -> None:
    """Run this process's worker for ``cfg.steps`` steps; writes ``ranks/rank{r}.jsonl`` under ``cfg.out``."""
    rank, world, _ = env_rank()
    torch.set_num_threads(cfg.resolved_threads())
    out = Path(cfg.out)
    sync = make_synchronizer(cfg)
    clean = False
    try:
        run_steps(cfg, sync, rank, world, out, freeze=True)  # the model (and a DDP wrapper) freed on return
        clean = True
    finally:
        sync.close()
        destroy_process_group(barrier=clean)  # on success, leave together: no rank tears down mid-collective
    (out / "ranks" / f"rank{rank}.done").touch()


def worker_batches(cfg: TrainConfig, rank: int, world: int) -> ShardedBatches:
    """This rank's batches of the training set (its partition, its augmentation, at the model's input size)."""
    data = build_dataset(cfg.dataset, cfg.num_samples, cfg.seed, cfg.data_dir, image_size=cfg.input_size)
    return ShardedBatches(data, rank, world, cfg.batch_size, cfg.seed, cfg.augment, cfg.partition, cfg.input_size)


def run_steps(cfg: TrainConfig, sync, rank: int, world: int, out: Path, freeze: bool = False) -> None:
    batches = worker_batches(cfg, rank, world)
    model, start = attach_model(cfg, sync, out)
    buffers = make_buffer_sync(model, sync, cfg.resolved_buffers, cfg.timeout_s)
    emu = EmulatedCompute(model, ms, cfg.seed + rank) if (ms := parse_compute(cfg.compute)) else None
    test = None  # the held-out split, loaded at the first epoch end
    slow = cfg.straggler_factor(rank)
    clock = PhaseClock(sync.device)
    compute_s = 0.0  # the previous step's forward+backward, which a straggler stretches by (slow - 1)
    wire = WireCounter()
    gate = sync.wait_params if sync.full else None  # --overlap full: emulated layers wait for their parameters
    pending = None  # --overlap full: the last step's record, until its communication is drained
    if freeze:  # a worker process (train): the model, synchronizer and imports out of the collector's reach
        freeze_setup_objects()
    with StepLog(out / "ranks" / f"rank{rank}.jsonl") as log:
        for step in range(start, cfg.steps):
            t0 = clock.now()
            x, y = batches.get(step)
            x, y = x.to(sync.device, non_blocking=True), y.to(sync.device, non_blocking=True)
            t1 = clock.now()
            if emu is not None:
                loss = emu.forward(slow, gate)
            else:
                if slow > 1 and compute_s:  # before forward, so this worker's gradients are late too
                    time.sleep((slow - 1) * compute_s)
                tc = clock.now()
                loss = F.cross_entropy(model(x), y)
            t2 = clock.now()
            pending = finish_record(pending, sync.drain(), log, cfg)  # before backward reuses the buffers
            t2d = clock.now()
            model.zero_grad(set_to_none=False)
            loss.backward()
            cpu0 = cpu_times()  # before t3: the read must not count as synchronization
            t3 = clock.now()
            if emu is None:
                compute_s = t3 - tc  # this step's own forward+backward, without the straggler's sleep
            st = with_buffers(sync.step(step), buffers)
            epoch, t = batches.epoch_of(step)
            evaluating = cfg.eval and emu is None and t + 1 == batches.steps_in_epoch(epoch)
            checkpointing = cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps
            # --overlap full: parameters are needed whole now, or the run ends: finish the step here
            drained = sync.drain() if evaluating or checkpointing or step + 1 == cfg.steps else None
            t4 = clock.now()
            cpu1 = cpu_times()
            wire_tx, wire_rx = wire.delta()
            acc = None
            if evaluating:  # every worker: the same cost on every rank keeps the next step's timing unskewed
                if test is None:
                    test = build_dataset(cfg.dataset, None, cfg.seed, cfg.data_dir, "test", cfg.input_size)
                acc = evaluate(getattr(model, "module", model), test, device=sync.device, image_size=cfg.input_size)
            rec = step_record(cfg, sync, st, (t0, t1, t2, t2d, t3, t4), rank=rank, step=step, loss=loss.item(),
                              samples=len(y), epoch=epoch, test_acc=acc, wire_tx_bytes=wire_tx,
                              wire_rx_bytes=wire_rx, cpu_sync=[*cpu0, *cpu1] if cpu0 and cpu1 else None)
            # before the step is logged: a restart resumes from a checkpoint whose step every worker logged,
            # so every rank's own file of it (checkpoint.save_rank) is then written too
            if checkpointing:
                save_checkpoint(cfg, sync, rank, out, step, model)
            pending = finish_record(rec, drained, log, cfg) if sync.full else write_record(rec, log, cfg)
    if rank == 0:
        save_model(getattr(model, "module", model), out / "model.pt")


def with_buffers(st, buffers: BufferSync):
    """The step's ``SyncStats`` with the buffers' agreement after it (``--buffers``): its time a part of
    sync (``buffers_s``), its bytes in the step's and apart (``buffer_bytes``)."""
    seconds, sent = buffers.sync()
    if buffers.active:
        st.phases.update(buffers_s=seconds, buffer_bytes=sent)
        st.bytes_sent, st.bytes_recv = st.bytes_sent + sent, st.bytes_recv + sent
    return st


def step_record(cfg: TrainConfig, sync, st, times: tuple, **fields) -> StepRecord:
    """The step's record from its clock readings: t0 start, t1 data there, t2 forward done, t2d the last
    step drained (``--overlap full``), t3 backward done, t4 synchronized. Forward's waits for the last
    step's parameters (``take_waits``) and the drain count as synchronization, updates run there as update."""
    t0, t1, t2, t2d, t3, t4 = times
    gate_s, update_s = sync.take_waits()
    update_s += st.update_s
    sync_s = None if st.sync_s is None else t4 - t3 + t2d - t2 + gate_s - update_s
    return StepRecord(step_s=t4 - t0, data_s=t1 - t0, forward_s=t2 - t1 - gate_s, backward_s=t3 - t2d,
                      sync_s=sync_s, update_s=update_s, bytes_sent=st.bytes_sent, bytes_recv=st.bytes_recv,
                      time=time.time(), sync_phases={**st.phases, **({"gate_s": gate_s} if sync.full else {})},
                      messages=st.messages if cfg.trace else None,
                      ready=(st.ready or None) if cfg.trace else None, **fields)


def finish_record(rec: StepRecord | None, drained, log: StepLog, cfg: TrainConfig) -> StepRecord | None:
    """``--overlap full``: ``rec``'s step's communication was ``drained`` (its ``SyncStats``; None: not
    yet): its bytes, trace messages and readiness marks go into the record, which is written. Returns
    the record still waiting (``rec`` when not drained, else None). Times stay with the loop iteration
    they were spent in, so a run's step times still add up to its wall time."""
    if rec is None or drained is None:
        return rec
    extra = rec.sync_phases.get("buffer_bytes", 0)  # --buffers: sent in the step itself, not drained
    rec.bytes_sent, rec.bytes_recv = drained.bytes_sent + extra, drained.bytes_recv + extra
    if cfg.trace:
        rec.messages, rec.ready = drained.messages, drained.ready or None
    return write_record(rec, log, cfg)


def write_record(rec: StepRecord, log: StepLog, cfg: TrainConfig) -> None:
    log.write(rec)
    if rec.rank == 0 and (rec.step % cfg.log_every == 0 or rec.step == cfg.steps - 1 or rec.test_acc is not None):
        print_step(rec, cfg)


def attach_model(cfg: TrainConfig, sync, out: Path) -> tuple[torch.nn.Module, int]:
    """(the module to run forward on, the first step): the seeded model, resumed from ``cfg.resume`` if
    given (parameters and buffers before attach: rank 0 hands them to the PS servers), attached; rank 0
    writes what attach chose to ``out`` (``write_tuned``)."""
    model, start = model_of(cfg), 0
    if cfg.resume:
        ckpt = checkpoint.load(cfg.resume)
        model.load_state_dict(ckpt["model"])
        start = ckpt["step"] + 1
        sync.resume_from(ckpt["sync"], start, checkpoint.load_rank(cfg.resume, sync.rank, ckpt["step"]))
    model = sync.attach(model.to(sync.device))
    write_tuned(sync, sync.rank, out)
    model.train()
    return model, start


def write_tuned(sync, rank: int, out: Path) -> None:
    """Rank 0: what attach measured and chose (``--link-tuning``), as summary.json's fields."""
    if rank == 0 and sync.tuned:
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "tuned.json", json.dumps(sync.tuned) + "\n")
        print(f"[psring] link schedule: {sync.tuned}", flush=True)


def save_checkpoint(cfg: TrainConfig, sync, rank: int, out: Path, step: int, model: torch.nn.Module) -> None:
    own = sync.rank_state()  # what only this rank holds (a PS worker's residuals): its own file
    if own:
        checkpoint.save_rank(out, step, rank, own)
    state = sync.state_dict()  # ps: rank 0 fetches the servers' shards; others return {}
    if rank == 0:
        checkpoint.save(out, step, getattr(model, "module", model), state, cfg.to_dict())


def print_step(rec: StepRecord, cfg: TrainConfig) -> None:
    sync = "     -   " if rec.sync_s is None else f"{rec.sync_s * 1e3:7.1f} ms"
    acc = "" if rec.test_acc is None else f"  test acc {rec.test_acc:.3f}"
    print(f"[{cfg.sync:>9} N={cfg.workers}] step {rec.step:5d}/{cfg.steps}  loss {rec.loss:7.4f}  "
          f"step {rec.step_s * 1e3:7.1f} ms  sync {sync}{acc}", flush=True)


def save_model(model: torch.nn.Module, path: Path) -> None:
    torch_save_atomic(model.state_dict(), path)  # a full disk: WriteError naming it, no model.pt.tmp left


def main_worker(cfg: TrainConfig) -> int:
    """Entry point of ``psring worker``: train, report a failure on one line (traceback above it in the
    log); outside the launcher (torchrun), hand the records to rank 0, which merges them."""
    if cfg.epochs and not launched_by_psring() and os.environ.get("RANK", "0") == "0":
        from ..config_checks import epochs_line  # every rank resolved them alike (config.validate)

        print(epochs_line(cfg), flush=True)  # the launcher's line, which torchrun has none of
    try:
        train(cfg)
    except Exception as e:  # noqa: BLE001 - turned into one line for the launcher, full traceback in the log
        import traceback

        try:
            traceback.print_exc()
        except OSError:
            pass  # a full disk holding the log: the one line below may still fit, or the launcher says why
        rank = os.environ.get("RANK", "0")
        # a full disk while appending records (no file named): say so, and where
        what = describe(e, e.filename or cfg.out) if isinstance(e, OSError) and e.errno in CAUSES else e
        print(f"psring worker {rank}: error: {type(e).__name__}: {what}", file=sys.stderr, flush=True)
        return 1
    finally:
        stop_started()  # a colocated server this worker started (torchrun): done, or stopped now
    if not launched_by_psring():
        finish_outside_launcher(cfg)
    return 0


def finish_outside_launcher(cfg: TrainConfig) -> None:
    """Every rank's records (and those of the colocated servers workers started) to rank 0, which
    writes steps.jsonl and summary.json: the output folder may or may not be shared between hosts."""
    from ..metrics.summary import finalize_run
    from ..sync.ps.colocated import server_records, started_hosts
    from ..topology import local_world

    rank, world, _ = env_rank()
    out, mine = Path(cfg.out), {h: server_records(cfg.out, h) for h in started_hosts()}
    # rank 0 (node 0's local rank 0) started one when every node did: the others' come through the store
    servers = list(range(1, world // local_world())) if mine and rank == 0 else []
    gather_records(out, rank, world, cfg.timeout_s, mine, servers)
    if rank == 0:
        finalize_run(out, cfg.to_dict())
