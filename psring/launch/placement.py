"""Where each process of a local run lives: on loopback (the default), or each worker and PS server on
its own emulated host (``--net emulated``: a network namespace behind a rate-limited link, see
``psring.net``). The launcher asks a ``Placement`` for a process's command prefix, the address it binds
or is reached at, and extra environment; nothing else in the launcher knows about namespaces.

Host numbering in an emulated run: workers 0..N-1 are hosts 0..N-1, PS servers 0..S-1 hosts N..N+S-1.
"""
from __future__ import annotations

from ..config import TrainConfig
from ..metrics.wire import ENV as WIRE_ENV
from ..net import EmulatedNetwork, check_available
from ..strategies import uses_servers

LOOPBACK = "127.0.0.1"


class Placement:
    def __init__(self, cfg: TrainConfig):
        self.cfg, self.net = cfg, None
        if cfg.net != "emulated":
            return
        servers = cfg.servers if uses_servers(cfg.sync) else 0
        overrides = {cfg.workers + i: cfg.server_link_rate for i in range(servers)} if cfg.server_link_rate else None
        check_available()  # NetError (a ConfigError): one line, exit 2
        self.net = EmulatedNetwork(cfg.workers + servers, cfg.link_rate, overrides, cfg.link_delay).open()

    def _host(self, i: int) -> tuple[list[str], str]:
        if self.net is None:
            return [], LOOPBACK
        return self.net.exec_prefix(i), self.net.hosts[i].addr

    def worker(self, rank: int) -> tuple[list[str], str]:
        """(command prefix, address) of worker ``rank``."""
        return self._host(rank)

    def server(self, i: int) -> tuple[list[str], str]:
        """(command prefix, address to bind) of PS server ``i``."""
        return self._host(self.cfg.workers + i)

    def worker_env(self) -> dict:
        # gloo picks an interface from the hostname's address, which inside a namespace is not eth0's
        # PSRING_WIRE_IFACE: workers count their link's bytes per step (metrics/wire.py)
        if self.net is None:
            return {}
        return {"GLOO_SOCKET_IFNAME": self.net.hosts[0].iface, WIRE_ENV: self.net.hosts[0].iface}

    def describe(self) -> str:
        if self.net is None:
            return "loopback"
        rate = self.cfg.link_rate + (f", servers {self.cfg.server_link_rate}" if self.cfg.server_link_rate else "")
        return f"emulated hosts ({len(self.net.hosts)} namespaces, links {rate})"

    def close(self) -> None:
        if self.net is not None:
            self.net.close()
            self.net = None
