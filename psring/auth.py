"""CurveZMQ for the parameter server: encryption plus client authentication, for runs across hosts.

A PS server listens on a TCP port; on a shared cluster that port must not take pushes from strangers.
With ``--curve DIR`` a server only accepts clients whose public key lies in ``DIR/authorized/``, and
every byte is encrypted (CurveZMQ, RFC 26; pyzmq's ``zmq.auth``). Key files are ZeroMQ certificates
(``NAME.key`` public, ``NAME.key_secret`` secret), written by ``psring keys DIR``::

    DIR/server.key  DIR/server.key_secret      the servers' pair (copy the secret only to server hosts)
    DIR/worker.key  DIR/worker.key_secret      the workers' pair (copy the secret only to worker hosts)
    DIR/authorized/worker.key                  public keys a server accepts (add more with --name)

A client without an accepted key completes no handshake: its requests are dropped by ZeroMQ before
the server ever sees them, so it gets no reply (and the PS client's timeout reports that).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

SERVER, WORKER, AUTHORIZED = "server", "worker", "authorized"


class AuthError(ValueError):
    """Missing or unreadable key files; one line, for the CLI."""


def make_keys(directory: str | Path, name: str = WORKER) -> list[Path]:
    """Create ``DIR`` with a server pair (once) and a client pair ``name`` authorized to connect."""
    if not zmq.has("curve"):
        raise AuthError("this libzmq was built without CURVE support")
    d = Path(directory)
    (d / AUTHORIZED).mkdir(parents=True, exist_ok=True)
    made = []
    for who in ([SERVER] if not (d / f"{SERVER}.key_secret").exists() else []) + [name]:
        if (d / f"{who}.key_secret").exists():
            raise AuthError(f"{d / who}.key_secret exists; pick another --name or another directory")
        public, secret = zmq.auth.create_certificates(d, who)
        Path(secret).chmod(0o600)
        made += [Path(public), Path(secret)]
    shutil.copy(d / f"{name}.key", d / AUTHORIZED / f"{name}.key")
    return made


def _load(path: Path, secret: bool) -> tuple[bytes, bytes | None]:
    try:
        public, sec = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise AuthError(f"cannot read CURVE key {path}: {e} (create keys with `psring keys DIR`)") from None
    if secret and sec is None:
        raise AuthError(f"{path} holds no secret key")
    return public, sec


def check_dir(directory: str | Path, role: str) -> None:
    """Raise ``AuthError`` now (before any process starts) unless ``role``'s key files are there."""
    d = Path(directory)
    if role == SERVER:
        _load(d / f"{SERVER}.key_secret", secret=True)
        if not any((d / AUTHORIZED).glob("*.key")):
            raise AuthError(f"{d / AUTHORIZED} holds no client public key; create one with `psring keys {d}`")
    else:
        _load(d / f"{SERVER}.key", secret=False)
        _load(d / f"{role}.key_secret", secret=True)


def secure_server(ctx: zmq.Context, sock: zmq.Socket, directory: str | Path) -> ThreadAuthenticator:
    """Make ``sock`` (before bind) a CURVE server accepting only ``DIR/authorized/*.key``; the returned
    authenticator thread must be stopped with the context (``auth.stop()``)."""
    d = Path(directory)
    public, secret = _load(d / f"{SERVER}.key_secret", secret=True)
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(d / AUTHORIZED))
    sock.curve_secretkey, sock.curve_publickey, sock.curve_server = secret, public, True
    return auth


def secure_client(sock: zmq.Socket, directory: str | Path, name: str = WORKER) -> None:
    """Make ``sock`` (before connect) a CURVE client with key pair ``name``, trusting ``DIR/server.key``."""
    d = Path(directory)
    server_public, _ = _load(d / f"{SERVER}.key", secret=False)
    public, secret = _load(d / f"{name}.key_secret", secret=True)
    sock.curve_secretkey, sock.curve_publickey, sock.curve_serverkey = secret, public, server_public
