"""Emulated cluster networks: each host of a run in its own network namespace, links shaped with tbf.

Usage::

    check_available()                      # NetError (one line) if not root / no iproute2 / no kernel support
    with EmulatedNetwork(4, "1gbit", rate_overrides={3: "10gbit"}) as net:
        subprocess.Popen(net.exec_prefix(0) + [sys.executable, "-m", "psring", "worker", ...])
        ...                                # host i is reachable at net.hosts[i].addr

``cleanup()`` removes namespaces left behind by runs that died with their reaper (``psring net cleanup``).
"""
from .emulated import EmulatedNetwork, Host, NetError, check_available, cleanup, parse_rate

__all__ = ["EmulatedNetwork", "Host", "NetError", "check_available", "cleanup", "parse_rate"]
