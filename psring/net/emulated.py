"""An emulated cluster network on one machine: one network namespace per host, all wired to one switch.

Layout (N hosts)::

    host ns psr-<pid>-<hex>-h<i>:  lo, eth0 = 10.213.0.<i+1>/24, tbf on eth0 egress (= host upload)
                                     |  veth pair
    switch ns psr-<pid>-<hex>-sw:  s<i> -- bridge br0,  tbf on s<i> egress (= host download)

Each host's link is shaped in both directions, so N workers pushing to one server queue at that server's
download link just as they would at a real switch port. Addresses live only inside these namespaces, so two
runs (each with its own switch) can use the same range side by side. Processes are put on a host with
``exec_prefix(i) + [cmd...]``.

Teardown deletes the namespaces, which takes the veths and qdiscs with them. ``close()`` does it on every
normal path; a small reaper process (see ``reaper.py``) does it when the owner dies without running
``close()`` (SIGKILL, OOM kill); ``cleanup()`` removes whatever both missed (e.g. the reaper was killed too).
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from ..config import ConfigError
from . import tcp
from .reaper import CMD_TIMEOUT_S, PREFIX, delete_namespaces, list_namespaces, stale_namespaces

SUBNET = "10.213.0"  # private (RFC 1918); only ever configured inside this run's namespaces
MAX_HOSTS = 253  # .1 ... .253 in one /24
IFACE = "eth0"

# tbf parameters, measured on this kernel (6.x, veth with GSO, default congestion control bbr):
# - burst 1 MB: veth hands tbf GSO super-packets of up to 64 KB and TCP sends in TSO-sized bursts; with a
#   burst near one packet tbf throttles every packet and goodput falls short (64 KB: -4..9 % at 1 Gbit;
#   128 KB and up: fine at 100 Mbit and 1 Gbit; earlier tests saw TCP break with small bursts); 1 MB leaves
#   margin above 1 Gbit, which two cores cannot drive from Python to measure. The cost: after an idle
#   spell the first ~1 MB crosses a link at full speed (80 ms of line time at 100 Mbit, 8 ms at 1 Gbit).
# - latency 20 ms: sizes the queue (tbf: limit = rate * latency + burst), a switch-port buffer sized in
#   time. The burst term already holds several GSO packets per sender, so 10, 20 and 50 ms all gave full
#   rate and fair incast shares (2 and 4 senders); more only adds queueing delay to every RTT under load.
BURST = "1mb"
# A smaller burst (e.g. 128kb, fine at 100 Mbit by the above) when messages are only a few MB: a 1 MB credit
# refilled during compute then carries a visible share of each step for free, faster than the link's rate.
_BURST_RE = re.compile(r"^\d+(?:kb|mb)$")
LATENCY = "20ms"

_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit)\s*$", re.IGNORECASE)
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}  # SI, as tc uses
_DELAY_RE = re.compile(r"^\d+(?:\.\d+)?(?:us|ms|s)$")


class NetError(ConfigError):
    """A problem the user can fix (no root, no iproute2, a bad rate); one line, which the CLI prints
    like any configuration error (``psring: error: ...``, exit 2)."""


def _tool(name: str) -> str | None:
    # ip/tc live in /usr/sbin, which is not always on a (non-root or sudo'd) PATH.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")


def _run(cmd: list[str], what: str) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetError(f"emulated network: cannot {what} ({e})") from None
    if r.returncode != 0:
        detail = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        raise NetError(f"emulated network: cannot {what}: {' '.join(cmd[1:])}: {detail}")


def parse_rate(text: str) -> int:
    """``"100mbit"``, ``"1gbit"``, ``"1.5gbit"``, ``"500kbit"`` -> bits per second (SI units, like tc)."""
    m = _RATE_RE.match(text)
    bps = int(float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]) if m else 0
    if bps < 1000:  # below 1 kbit a 1 MB burst makes shaping meaningless; 0 or junk is a typo
        raise NetError(f"bad link rate {text!r}: use a number and a unit, e.g. 500kbit, 100mbit, "
                       f"1gbit, 1.5gbit (kbit, mbit, gbit; at least 1kbit)")
    return bps


def _check_basics() -> None:
    if os.geteuid() != 0:
        raise NetError("--net emulated needs root (run as root or use --net loopback)")
    if not (_tool("ip") and _tool("tc")):
        raise NetError("--net emulated needs iproute2's `ip` and `tc` (apt install iproute2)")


def check_available() -> None:
    """Raise NetError unless this process can build an EmulatedNetwork (root, iproute2, kernel support).

    The last check builds a throwaway namespace with a bridge, a veth pair and a tbf qdisc, so a container
    without CAP_SYS_ADMIN or a kernel without veth/bridge/sch_tbf is reported here, in one line.
    """
    _check_basics()
    ip, tc = _tool("ip") or "ip", _tool("tc") or "tc"
    ns = f"{PREFIX}{os.getpid()}-{secrets.token_hex(2)}-chk"
    _run([ip, "netns", "add", ns], "create a network namespace")
    try:
        _run([ip, "-n", ns, "link", "add", "br0", "type", "bridge"], "create a bridge (kernel module bridge)")
        _run([ip, "-n", ns, "link", "add", "chk0", "type", "veth", "peer", "name", "chk1"],
             "create a veth pair (kernel module veth)")
        _run([tc, "-n", ns, "qdisc", "add", "dev", "chk0", "root", "tbf", "rate", "100mbit", "burst", BURST,
              "latency", LATENCY], "add a tbf qdisc (kernel module sch_tbf)")
    finally:
        delete_namespaces(ip, [ns])


@dataclass(frozen=True)
class Host:
    index: int
    netns: str
    addr: str  # IPv4 address of ``iface``, reachable from every other host of the network
    rate_bps: int  # this host's link rate, each direction
    iface: str = IFACE


class EmulatedNetwork:
    """``n_hosts`` namespaces on one shaped switch; use as a context manager (or ``open()``/``close()``).

    ``link_rate`` applies to both directions of every host's link; ``rate_overrides`` ({host index: rate})
    gives some hosts (e.g. PS servers) another one; ``burst``: tbf's bucket (see ``BURST``); ``cc``: TCP's congestion
    control on every host (``tcp``; "": the machine's). ``delay`` (e.g. ``"5ms"``) is added once on the way between
    any two hosts (on each host's upload), so host-to-host RTT grows by twice that.
    """

    def __init__(self, n_hosts: int, link_rate: str, rate_overrides: dict[int, str] | None = None,
                 delay: str | None = None, burst: str = BURST, cc: str = ""):
        if not 1 <= n_hosts <= MAX_HOSTS:
            raise NetError(f"emulated network: {n_hosts} hosts requested, 1 to {MAX_HOSTS} supported")
        rates = {i: parse_rate(link_rate) for i in range(n_hosts)}
        for i, r in (rate_overrides or {}).items():
            if i not in rates:
                raise NetError(f"emulated network: rate override for host {i}, but hosts are 0..{n_hosts - 1}")
            rates[i] = parse_rate(r)
        if delay is not None and not _DELAY_RE.match(delay):
            raise NetError(f"bad link delay {delay!r}: use a number and a unit, e.g. 200us, 5ms, 0.1s")
        if not _BURST_RE.match(burst) or int(burst[:-2]) * (1024 if burst.endswith("kb") else 2**20) < 64 * 1024:
            raise NetError(f"bad link burst {burst!r}: kilobytes or megabytes, at least 64kb, e.g. 128kb, 1mb")
        if (why := tcp.unknown(cc)) is not None:
            raise NetError(f"--link-cc {why}")
        self.delay, self.burst, self.want_cc, self.cc = delay, burst, cc, ""  # cc: what the hosts run, once built
        self.prefix = f"{PREFIX}{os.getpid()}-{secrets.token_hex(2)}-"  # unique per run: runs can coexist
        self.switch_netns = self.prefix + "sw"
        self.hosts = [Host(i, f"{self.prefix}h{i}", f"{SUBNET}.{i + 1}", rates[i])
                      for i in range(n_hosts)]
        self._ip, self._tc = _tool("ip") or "ip", _tool("tc") or "tc"
        self._reaper: subprocess.Popen | None = None
        self._reaper_fd: int | None = None  # write end of the pipe whose EOF tells the reaper to clean up

    @property
    def names(self) -> list[str]:
        """Every namespace of this run (switch first)."""
        return [self.switch_netns] + [h.netns for h in self.hosts]

    def exec_prefix(self, i: int, hostname: bool = False) -> list[str]:
        """Prepend to a command line to run it on host ``i``; with ``hostname``, in a UTS namespace of
        its own whose hostname is the host's address, so that tools which find "this host" by its name
        (torchrun's c10d rendezvous, gloo) find this one, as on a real machine."""
        prefix = [self._ip, "netns", "exec", self.hosts[i].netns]
        if not hostname:
            return prefix
        return prefix + ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', self.hosts[i].addr]

    def switch_prefix(self) -> list[str]:
        """Prepend to a command line to run it in the switch namespace (where every host's port is)."""
        return [self._ip, "netns", "exec", self.switch_netns]

    def host_counters(self) -> list[tuple[int, int]]:
        """(sent, received) bytes of every host's link interface since it was created, as its kernel counts them."""
        from .links import kernel_totals

        return [kernel_totals(self._ip, h.netns, h.iface) for h in self.hosts]

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def open(self) -> Self:
        if self._reaper is not None:
            raise RuntimeError("EmulatedNetwork.open() called twice")  # a 2nd build would clash with the 1st
        _check_basics()  # the one-line messages for the common cases, before anything is created
        self._start_reaper()  # before the first namespace, so a kill during setup is covered too
        try:
            self._build()
        except BaseException:  # including KeyboardInterrupt mid-setup: leave nothing behind
            self.close()
            raise
        return self

    def close(self) -> None:
        """Delete this run's namespaces and stop the reaper. Idempotent; safe from a signal handler.

        Every step tolerates having been done already (or half done by an interrupted call), so a second
        call, e.g. from a SIGTERM handler during the first, finishes the job instead of skipping it.
        """
        try:
            mine = [n for n in list_namespaces(self._ip) if n.startswith(self.prefix)]
            delete_namespaces(self._ip, mine)
        except (OSError, subprocess.SubprocessError):
            pass  # the reaper below still tries once the pipe closes
        fd, self._reaper_fd = self._reaper_fd, None
        if fd is not None:
            try:
                os.write(fd, b"closed")  # "not a crash": the reaper looks once instead of twice
            except OSError:
                pass  # reaper already gone: nothing to tell
            os.close(fd)  # reaper sees EOF, finds nothing left (or deletes what the step above missed)
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            try:
                reaper.wait(CMD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                reaper.kill()
                reaper.wait()

    def _start_reaper(self) -> None:
        r, w = os.pipe()  # both ends non-inheritable: our other children do not keep the reaper waiting
        try:
            # Own session: a Ctrl-C or a killpg aimed at the caller's process group does not reach it.
            # stdout/stderr to /dev/null: holding a caller's pipe open would make its reader wait for us.
            self._reaper = subprocess.Popen(
                [sys.executable, "-S", str(Path(__file__).with_name("reaper.py")), self._ip, self.prefix],
                stdin=r, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        self._reaper_fd = w
        # Note: a plain os.fork() of the owner (multiprocessing's "fork") copies w, and the reaper then
        # waits for that child as well; subprocess children (close_fds) do not get it.

    def _build(self) -> None:
        ip, tc, sw = self._ip, self._tc, self.switch_netns
        _run([ip, "netns", "add", sw], "create the switch namespace")
        _run([ip, "-n", sw, "link", "set", "lo", "up"], "bring up lo")
        # STP is off by default, so ports forward at once (no 15 s listening/learning delay).
        _run([ip, "-n", sw, "link", "add", "br0", "type", "bridge"], "create the switch bridge")
        _run([ip, "-n", sw, "link", "set", "br0", "up"], "bring up the bridge")
        for h in self.hosts:
            port = f"s{h.index}"  # short: the 15-char limit applies, but only within the switch namespace
            _run([ip, "netns", "add", h.netns], f"create namespace for host {h.index}")
            _run([ip, "-n", h.netns, "link", "set", "lo", "up"], "bring up lo")
            # Created straight into the two namespaces: no name is ever taken in the root namespace.
            _run([ip, "link", "add", port, "netns", sw, "type", "veth", "peer", "name", h.iface,
                  "netns", h.netns], f"create the veth pair of host {h.index}")
            _run([ip, "-n", sw, "link", "set", port, "master", "br0", "up"], "attach a port to the bridge")
            _run([ip, "-n", h.netns, "addr", "add", f"{h.addr}/24", "dev", h.iface], "set an address")
            _run([ip, "-n", h.netns, "link", "set", h.iface, "up"], f"bring up {h.iface}")
            tbf = ["tbf", "rate", f"{h.rate_bps}bit", "burst", self.burst, "latency", LATENCY]
            if self.delay is None:
                _run([tc, "-n", h.netns, "qdisc", "replace", "dev", h.iface, "root", *tbf],
                     "shape the upload")
            else:
                self._add_netem(h)
                _run([tc, "-n", h.netns, "qdisc", "add", "dev", h.iface, "parent", "1:1", "handle", "10:",
                      *tbf], "shape the upload")
            _run([tc, "-n", sw, "qdisc", "replace", "dev", port, "root", *tbf], "shape the download")
        self.cc = tcp.apply(ip, [h.netns for h in self.hosts], self.want_cc, _run, NetError)

    def _add_netem(self, h: Host) -> None:
        # netem at the root delays, tbf as its child then shapes: the tc-netem(8) recipe for "delay + rate".
        cmd = [self._tc, "-n", h.netns, "qdisc", "replace", "dev", h.iface, "root", "handle", "1:", "netem",
               "delay", str(self.delay)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=False)
        if r.returncode != 0:
            if "unknown" in r.stderr.lower() or "no such file" in r.stderr.lower():
                raise NetError("link delay needs the sch_netem kernel module, which this kernel "
                               "lacks (drop the delay option)")
            _run(cmd, "add link delay")  # raises with tc's own message


def cleanup(all_runs: bool = False) -> list[str]:
    """Delete leftover psring namespaces whose owner is dead (every psring namespace if ``all_runs``).

    Backs ``psring net cleanup``. Only names of psring's own shape (``NAME_RE``) are touched. A dead run
    whose pid now belongs to an unrelated process looks alive; ``all_runs`` removes it. Returns the names
    removed.
    """
    ip = _tool("ip")
    if ip is None:
        raise NetError("net cleanup needs iproute2's `ip` (apt install iproute2)")
    if os.geteuid() != 0:
        raise NetError("net cleanup needs root (run as root)")
    stale = stale_namespaces(ip, all_runs)
    delete_namespaces(ip, stale)
    return [n for n in stale if n not in set(list_namespaces(ip))]
