"""CurveZMQ: a server started with keys gives nothing to a client without an accepted key, and trains
normally with one that has it (loopback; the keys come from `psring keys`)."""
from __future__ import annotations

import json

import pytest
import torch
import zmq
from conftest import serving

from psring.auth import AUTHORIZED, make_keys, secure_client
from psring.sync.ps.client import PSClient, PSError
from psring.sync.ps.server import ParameterServer

OPTIM = {"lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}


@pytest.fixture
def keys(tmp_path):
    d = tmp_path / "keys"
    make_keys(d)  # server + "worker", authorized
    make_keys(d, "intruder")  # a valid key pair the server does not list
    (d / AUTHORIZED / "intruder.key").unlink()
    return d


@pytest.fixture
def curve_server(keys):
    with serving(ParameterServer(workers=1, port=0, curve=str(keys))) as srv:
        yield srv


def test_unlisted_key_gets_nothing_listed_key_trains(curve_server, keys):
    intruder = PSClient([curve_server.address], 0, timeout_s=1.5, curve=None)
    try:
        intruder.socks[0].close(linger=0)  # reconnect with the unlisted key pair
        s = intruder.ctx.socket(zmq.DEALER)
        s.linger = 0
        secure_client(s, keys, "intruder")
        s.connect(curve_server.address)
        intruder.socks[0] = s
        with pytest.raises(PSError, match="did not answer"):
            intruder.call(0, {"op": "init", "optim": OPTIM}, [("w", torch.ones(4))])
    finally:
        intruder.close()
    plain = PSClient([curve_server.address], 0, timeout_s=1.5)  # no CURVE at all
    try:
        with pytest.raises(PSError, match="did not answer"):
            plain.call(0, {"op": "pull", "version": 0})
    finally:
        plain.close()
    assert not curve_server.store.initialized, "a request without an accepted key reached the store"

    worker = PSClient([curve_server.address], 0, timeout_s=10, curve=str(keys))
    try:
        worker.call(0, {"op": "init", "optim": OPTIM}, [("w", torch.ones(4))])
        header, [(key, w)] = worker.call(0, {"op": "pushpull", "step": 0}, [("w", torch.full((4,), 2.0))])
        assert key == "w" and torch.equal(w.tensor(), torch.full((4,), 0.8)) and header["version"] == 1  # 1 - 0.1 * 2
    finally:
        worker.close()


def test_train_with_curve_keys(psring, tmp_path):
    keys = tmp_path / "keys"
    r = psring.run("keys", str(keys), timeout=60)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "run"
    r = psring.run("train", "--sync", "ps", "--workers", "2", "--servers", "2", "--curve", str(keys),
                   "--steps", "5", "--out", str(out), timeout=180)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "summary.json").read_text())["steps_completed"] == 5
