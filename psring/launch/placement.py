"""Where each process of a local run lives: on loopback (the default), or each worker and PS server on
its own emulated host (``--net emulated``: a network namespace behind a rate-limited link, see
``psring.net``). The launcher asks a ``Placement`` for a process's command prefix, the address it binds
or is reached at, and extra environment; nothing else in the launcher knows about namespaces.

Host numbering in an emulated run: the N workers are on hosts 0..H-1, G = N/H on each
(``--workers-per-host``: worker r on host r // G, ranks consecutive per host as torchrun numbers them),
so the G workers of a host share its one shaped link and reach each other inside it (the kernel
delivers traffic to an address of the same namespace over its loopback: unshaped, the stand-in for
NVLink/PCIe). PS servers (``--ps-placement``): dedicated ones on hosts H, H+1, ... of their own;
colocated ones, server i on worker host i, sharing that host's link; mixed: servers 0..H-1 colocated,
the rest dedicated.
"""
from __future__ import annotations

from ..config import TrainConfig
from ..metrics.wire import ENV as WIRE_ENV
from ..net import EmulatedNetwork, check_available
from ..topology import DEVICE_ENV, colocated_servers
from ..strategies import uses_servers

LOOPBACK = "127.0.0.1"


def worker_host(cfg: TrainConfig, rank: int) -> int:
    """The emulated host of worker ``rank``."""
    return rank // cfg.per_host


def server_host(cfg: TrainConfig, i: int) -> int:
    """The emulated host of PS server ``i``: a worker host when colocated, else one of its own."""
    colocated = colocated_servers(cfg.ps_placement, cfg.hosts, cfg.servers)
    return i if i < colocated else cfg.hosts + i - colocated


def host_labels(cfg: TrainConfig) -> list[str]:
    """What runs on each emulated host, e.g. ``["worker 0", "worker 1", "server 0"]`` (``"workers 0-1 +
    server 0"`` where several share one): the rows of a link heatmap."""
    servers = cfg.servers if uses_servers(cfg.sync) else 0
    hosts = max([worker_host(cfg, r) for r in range(cfg.workers)] + [server_host(cfg, i) for i in range(servers)]) + 1
    on: list[list[str]] = [[] for _ in range(hosts)]
    g = cfg.per_host
    for h in range(cfg.hosts):
        on[h].append(f"worker {h * g}" if g == 1 else f"workers {h * g}-{h * g + g - 1}")
    for i in range(servers):
        on[server_host(cfg, i)].append(f"server {i}")
    return [" + ".join(x) for x in on]


class Placement:
    def __init__(self, cfg: TrainConfig):
        self.cfg, self.net = cfg, None
        self.worker_hosts = cfg.hosts
        servers = cfg.servers if uses_servers(cfg.sync) else 0
        self.colocated = colocated_servers(cfg.ps_placement, self.worker_hosts, servers)
        self.dedicated = servers - self.colocated
        if cfg.net != "emulated":
            return
        first = self.worker_hosts  # the first dedicated server host
        overrides = {first + i: cfg.server_link_rate for i in range(self.dedicated)} if cfg.server_link_rate else None
        check_available()  # NetError (a ConfigError): one line, exit 2
        self.net = EmulatedNetwork(first + self.dedicated, cfg.link_rate, overrides, cfg.link_delay,
                                   cfg.link_burst, cfg.link_cc).open()

    def _host(self, i: int) -> tuple[list[str], str]:
        if self.net is None:
            return [], LOOPBACK
        return self.net.exec_prefix(i), self.net.hosts[i].addr

    def worker_host(self, rank: int) -> int:
        return worker_host(self.cfg, rank)

    def worker(self, rank: int) -> tuple[list[str], str]:
        """(command prefix, address) of worker ``rank``."""
        return self._host(self.worker_host(rank))

    def server_host(self, i: int) -> int:
        return server_host(self.cfg, i)

    def server(self, i: int) -> tuple[list[str], str]:
        """(command prefix, address to bind) of PS server ``i``."""
        return self._host(self.server_host(i))

    def worker_env(self, rank: int) -> dict:
        """torchrun's per-node variables of worker ``rank`` (LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK: the
        host's index), the device it takes on this machine, and on emulated hosts its interface."""
        g = self.cfg.per_host
        env = {"LOCAL_RANK": rank % g, "LOCAL_WORLD_SIZE": g, "GROUP_RANK": rank // g, DEVICE_ENV: rank}
        if self.net is None:
            return env
        # gloo picks an interface from the hostname's address, which inside a namespace is not eth0's
        # PSRING_WIRE_IFACE: workers count their link's bytes per step (metrics/wire.py); a link shared
        # by G workers is counted once, by the host's local rank 0
        iface = self.net.hosts[0].iface
        env["GLOO_SOCKET_IFNAME"] = iface
        if rank % g == 0:
            env[WIRE_ENV] = iface
        return env

    def describe(self) -> str:
        if self.net is None:
            return "loopback"
        rate = self.cfg.link_rate + (f", servers {self.cfg.server_link_rate}" if self.cfg.server_link_rate else "")
        per = f", {self.cfg.per_host} workers each" if self.cfg.per_host > 1 else ""
        return f"emulated hosts ({len(self.net.hosts)} namespaces{per}, links {rate}, TCP {self.net.cc})"

    def close(self) -> None:
        if self.net is not None:
            self.net.close()
            self.net = None
