"""Entry point of ``psring server``: one parameter-server process (``server.ParameterServer``) that binds,
announces its port (atomically, so the launcher never reads a half-written one), serves, and exits 0
once every worker said done."""
from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import torch

from ...allocator import keep_freed_memory
from ...collector import freeze_setup_objects
from .server import MAX_MESSAGE_BYTES, ParameterServer

log = logging.getLogger("psring.server")


def run_server(workers: int, bind: str, port: int, port_file: str | None, idle_timeout_s: float,
               threads: int = 1, metrics_path: str | None = None, frame_bytes: int | None = None,
               curve: str | None = None, max_message_bytes: int = MAX_MESSAGE_BYTES) -> int:
    """Entry point of ``psring server``: bind, announce the port, serve, exit 0 when all workers are done."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s psring server %(levelname)s: %(message)s")
    keep_freed_memory()
    torch.set_num_threads(max(1, threads))
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(143)))
    server = ParameterServer(workers, bind, port, idle_timeout_s, metrics_path, frame_bytes, curve,
                             max_message_bytes)
    try:
        if port_file:  # atomic: the launcher never reads a half-written port
            tmp = Path(f"{port_file}.tmp{os.getpid()}")
            tmp.write_text(f"{server.address}\n")
            tmp.rename(port_file)
        log.info("serving %d workers at %s", workers, server.address)
        freeze_setup_objects()
        rc = server.serve()
        log.info("done: %d updates, %d rejected requests, %d replies dropped, %d B sent, %d B received",
                 server.store.version, server.errors, server.dropped, server.bytes_sent, server.bytes_recv)
        return rc
    finally:
        server.close()
