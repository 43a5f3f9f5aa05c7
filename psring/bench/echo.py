"""A raw ZeroMQ echo server: the PS's transport with none of its logic. Every message comes back as is.

With ``--update-bytes M`` it is instead the floor of a PS round trip on this machine: each frame is
read as float32 gradients of the next part of an M-byte parameter vector (in arrival order, wrapping
at M; zeros at start), torch's fused momentum-SGD kernel with the PS's default settings updates that
part, and the message is answered with the updated parameters (zero-copy) — the transport plus the
update, still with none of psring's logic (no header, no checks, no keys, no steps).

With ``--bsp N`` it is the floor of a BSP PS server: keyed pushes of N peers summed, one update, every
peer answered (``BSPRound``).

Run as ``python -m psring.bench.echo --port-file F``; exits on an empty message, SIGTERM, or when idle.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import zmq

from ..allocator import keep_freed_memory
from ..collector import freeze_setup_objects


def fused_sgd():
    """``step(params, grads, moms)``: torch's fused momentum-SGD kernel in place with the PS servers' default
    settings (``OptimConfig``), so a floor does the same work as their update; one thread, frames read-only."""
    import warnings

    import torch
    from torch.optim.sgd import sgd

    from ..config import OptimConfig

    warnings.filterwarnings("ignore", "The given buffer is not writable")  # frames are only read
    torch.set_num_threads(1)
    cfg = OptimConfig()

    def step(p, g, m) -> None:
        sgd([p], [g], [m], fused=True, weight_decay=cfg.weight_decay, momentum=cfg.momentum, lr=cfg.lr,
            dampening=0.0, nesterov=False, maximize=False)

    return step


def sgd_updater(nbytes: int):
    """``update(frame) -> memoryview`` of the updated parameters the frame's gradients were for."""
    import torch

    sgd = fused_sgd()
    params, moms, pos = torch.zeros(nbytes // 4), torch.zeros(nbytes // 4), 0

    def update(frame) -> memoryview:
        nonlocal pos
        g = torch.frombuffer(frame.buffer, dtype=torch.float32)
        if pos + g.numel() > params.numel():
            pos = 0
        p, m = params[pos:pos + g.numel()], moms[pos:pos + g.numel()]
        sgd(p, g, m)
        pos += g.numel()
        return memoryview(p.numpy()).cast("B")

    return update


class BSPRound:
    """``--bsp N``: the PS's own work on a chunk, with none of its logic: messages are ``[peer, key,
    gradients]``; once N peers have pushed a key, their gradients summed into one buffer, one fused
    momentum-SGD update of that key's parameters (the PS's default settings; of the sum, where psring's
    servers divide it by N first, one more pass), and every peer answered
    ``[peer, key, parameters]`` (zero-copy). Each push is acknowledged at once (``[peer, key]``), as
    psring's servers do under credits: credits that came back only with replies would deadlock, each
    worker holding the chunks the others' replies wait for."""

    def __init__(self, workers: int):
        self.workers, self.sgd, self.keys = workers, fused_sgd(), {}  # key -> [params, moms, sum, peers]

    def take(self, sock, msg) -> None:
        import torch

        peer, key, frame = msg
        sock.send_multipart([peer, key], copy=False)  # the ack: received (the sender's credit back)
        g = torch.frombuffer(frame.buffer, dtype=torch.float32)
        entry = self.keys.get(key.bytes)
        if entry is None:
            entry = self.keys[key.bytes] = [torch.zeros_like(g), torch.zeros_like(g), torch.zeros_like(g), []]
        params, moms, total, peers = entry
        total.add_(g) if peers else total.copy_(g)
        peers.append(peer)
        if len(peers) < self.workers:
            return
        self.sgd(params, total, moms)
        reply = memoryview(params.numpy()).cast("B")
        for p in peers:
            sock.send_multipart([p, key, reply], copy=False)
        peers.clear()


def serve(port_file: str, idle_timeout_s: float = 300.0, bind: str = "127.0.0.1", update_bytes: int = 0,
          freeze: bool = False, bsp: int = 0) -> int:
    """Echo until an empty message, SIGTERM or ``idle_timeout_s``; ``freeze``: as a process of its own, move
    what it holds once set up out of the collector's reach (``collector``), as psring's own processes do;
    ``bsp``: a ``BSPRound`` of that many peers instead of an echo."""
    keep_freed_memory()  # as psring's own processes do (``allocator``), so the comparison stays fair
    update = sgd_updater(update_bytes) if update_bytes else None
    rounds = BSPRound(bsp) if bsp else None
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    port = sock.bind_to_random_port(f"tcp://{bind}")
    tmp = Path(f"{port_file}.tmp{os.getpid()}")
    tmp.write_text(f"tcp://{bind}:{port}\n")
    tmp.rename(port_file)
    if freeze:
        freeze_setup_objects()
    try:
        while sock.poll(int(idle_timeout_s * 1000)):
            msg = sock.recv_multipart(copy=False)
            if len(msg) < 2 or (len(msg) == 2 and not len(msg[1])):  # (a peer's empty message)
                return 0
            if rounds is not None:
                rounds.take(sock, msg)
                continue
            if update is not None:
                msg = [msg[0], *(update(f) for f in msg[1:])]
            sock.send_multipart(msg, copy=False)
        return 1  # idle for too long: whoever started us is gone
    finally:
        sock.close()
        ctx.term()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--idle-timeout", type=float, default=300.0)
    ap.add_argument("--bind", default="127.0.0.1", help="address to listen on (default loopback only)")
    ap.add_argument("--update-bytes", type=int, default=0,
                    help="answer with SGD-updated parameters of this many bytes instead of echoing")
    ap.add_argument("--bsp", type=int, default=0, metavar="N",
                    help="keyed pushes of N peers summed, updated once and answered to all (the PS's own work)")
    a = ap.parse_args()
    raise SystemExit(serve(a.port_file, a.idle_timeout, a.bind, a.update_bytes, freeze=True, bsp=a.bsp))
