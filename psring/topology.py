"""Hosts with several workers: which ranks share a host, and how PS load is split between dedicated
and colocated servers. Plain arithmetic, no torch, so the launcher, the configuration and the workers
all read the same rules.

torchrun numbers ranks consecutively per node (``RANK = GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK``
for a fixed ``--nproc-per-node``), and psring's launcher does the same, so G = LOCAL_WORLD_SIZE workers
per host put rank r on host r // G.
"""
from __future__ import annotations

import os

from .costmodel import unified_split

# The launcher puts every worker of a run on this one machine: which device index each takes, so that
# G workers per emulated host still use distinct GPUs (LOCAL_RANK restarts at 0 on every host).
DEVICE_ENV = "PSRING_DEVICE_INDEX"


def local_world() -> int:
    """G from torchrun's LOCAL_WORLD_SIZE (1 where it is unset: a process alone on its host)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        raise RuntimeError(f"LOCAL_WORLD_SIZE must be an integer, got {os.environ['LOCAL_WORLD_SIZE']!r}") from None


def host_groups(world: int, per_host: int) -> list[list[int]]:
    """The ranks of each host, host by host.

    >>> host_groups(6, 2)
    [[0, 1], [2, 3], [4, 5]]
    """
    if per_host < 1 or world % per_host:
        raise ValueError(f"{world} workers do not fill hosts of {per_host}: every host runs the same number")
    return [list(range(h * per_host, (h + 1) * per_host)) for h in range(world // per_host)]


def cross_groups(world: int, per_host: int) -> list[list[int]]:
    """For each local rank l, the ranks with local rank l on every host: the groups that talk across hosts.

    >>> cross_groups(6, 2)
    [[0, 2, 4], [1, 3, 5]]
    """
    hosts = host_groups(world, per_host)
    return [[h[l] for h in hosts] for l in range(per_host)]


def colocated_servers(placement: str, hosts: int, servers: int) -> int:
    """How many of the ``servers`` run on the worker hosts (servers 0..c-1, on hosts 0..c-1; the rest
    on hosts of their own): none for ``dedicated``, all for ``colocated``, one per host for ``mixed``."""
    return {"dedicated": 0, "colocated": servers, "mixed": min(hosts, servers)}[placement]


def dedicated_share(placement: str, hosts: int, servers: int) -> float:
    """x, the share of the parameters the dedicated servers hold between them: 1 (dedicated), 0
    (colocated), BytePS's optimum for k = S - H beside the H colocated ones (mixed)."""
    if placement == "mixed":
        return unified_split(hosts, servers - colocated_servers(placement, hosts, servers))
    return 0.0 if colocated_servers(placement, hosts, servers) else 1.0


def server_shares(placement: str, hosts: int, servers: int) -> list[float] | None:
    """Each PS server's share of the parameters: None (equal shares) for ``dedicated`` and ``colocated``;
    for ``mixed`` (servers 0..H-1 on the H worker hosts, the other k = S - H on hosts of their own),
    BytePS's optimum (``costmodel.unified_split``): the dedicated servers take x of M between them.

    >>> [round(s, 3) for s in server_shares("mixed", 4, 6)]  # n = 4 worker hosts, k = 2: x = 0.6
    [0.1, 0.1, 0.1, 0.1, 0.3, 0.3]
    """
    k = servers - hosts
    if placement != "mixed" or not 0 < k < hosts:  # (config_checks refuses a mixed run outside this)
        return None
    x = dedicated_share(placement, hosts, servers)
    return [(1 - x) / hosts] * hosts + [x / k] * k
