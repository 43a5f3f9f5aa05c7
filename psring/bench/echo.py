"""A raw ZeroMQ echo server: the PS's transport with none of its logic. Every message comes back as is.

Run as ``python -m psring.bench.echo --port-file F``; exits on an empty message, SIGTERM, or when idle.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import zmq


def serve(port_file: str, idle_timeout_s: float = 300.0, bind: str = "127.0.0.1") -> int:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    port = sock.bind_to_random_port(f"tcp://{bind}")
    tmp = Path(f"{port_file}.tmp{os.getpid()}")
    tmp.write_text(f"tcp://{bind}:{port}\n")
    tmp.rename(port_file)
    try:
        while sock.poll(int(idle_timeout_s * 1000)):
            msg = sock.recv_multipart(copy=False)
            if len(msg) < 2:
                return 0
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
    a = ap.parse_args()
    raise SystemExit(serve(a.port_file, a.idle_timeout, a.bind))
