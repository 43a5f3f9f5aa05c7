"""Sub-commands around the runs: ``psring calibrate``, ``psring plot``, ``psring net cleanup``, ``psring keys``.

Kept apart from ``cli.py`` (training, sweeps, bench) so each file stays about one thing. Every command
returns an exit code; user errors raise ``ConfigError`` (one line, exit 2).
"""
from __future__ import annotations

import shlex
import signal
import subprocess
import sys

from .config import ConfigError


def cmd_calibrate(a) -> int:
    """Measure alpha and B over loopback, or over one emulated link (two hosts of ``--net emulated``)."""
    from .calibrate import check_args, parser
    from .fileio import out_folder

    args = ["--out", a.out, "--repeats", str(a.repeats)] + (["--sizes", a.sizes] if a.sizes is not None else []) \
        + (["--overwrite"] if a.overwrite else [])
    check_args(parser().parse_args(args))  # one line for a bad flag or a calibration in the way, before a network
    out_folder(a.out)  # (and for an --out that cannot be made)
    if a.net == "loopback":
        from .calibrate import main as calibrate_main

        if a.link_cc:
            raise ConfigError("--link-cc needs --net emulated (loopback runs under the machine's own)")
        return calibrate_main(args)
    if a.net != "emulated":
        raise ConfigError(f"--net must be loopback or emulated, got {a.net!r}")
    from .launch.children import die_with_parent, raise_interrupt
    from .net import EmulatedNetwork, check_available

    check_available()  # NetError (a ConfigError): one line, exit 2
    old = signal.signal(signal.SIGTERM, raise_interrupt)  # (run() kills its child on the way out)
    net = None
    try:  # the client runs on host 0, the echo server on host 1: every byte crosses both links
        net = EmulatedNetwork(2, a.link_rate, cc=a.link_cc).open()
        argv = net.exec_prefix(0) + [sys.executable, "-m", "psring.calibrate", *args,
                                     "--prefix", shlex.join(net.exec_prefix(1)), "--address",
                                     f"tcp://{net.hosts[1].addr}"]
        return subprocess.run(argv, timeout=600, preexec_fn=die_with_parent).returncode
    except subprocess.TimeoutExpired:
        print("psring: error: calibration did not finish within 600 s", file=sys.stderr)
        return 1
    finally:
        if net is not None:
            net.close()
        signal.signal(signal.SIGTERM, old)


def cmd_net(a) -> int:
    from .net import cleanup

    removed = cleanup(all_runs=a.all)  # NetError (a ConfigError) without root or iproute2
    print(f"removed {len(removed)} namespace(s)" + (": " + ", ".join(removed) if removed else ""))
    return 0


def cmd_keys(a) -> int:
    from .auth import AuthError, make_keys

    try:
        made = make_keys(a.dir, a.name)
    except AuthError as e:
        raise ConfigError(str(e)) from None
    for path in made:
        print(path)
    print(f"servers: --curve {a.dir} (needs server.key_secret and authorized/); "
          f"workers: --curve {a.dir} (needs server.key and {a.name}.key_secret)")
    return 0


def add_tool_parsers(sub) -> None:
    k = sub.add_parser("keys", help="write CurveZMQ key pairs for --curve (servers accept only listed workers)")
    k.add_argument("dir", help="key folder (created)")
    k.add_argument("--name", default="worker", help="the client key pair's name (default %(default)s)")
    k.set_defaults(func=cmd_keys)

    c = sub.add_parser("calibrate", help="measure latency alpha and bandwidth B for the cost model")
    c.add_argument("--out", default="results/calibration", help="directory for calibration.json")
    c.add_argument("--net", default="loopback", help="loopback (default) | emulated (one rate-limited link)")
    c.add_argument("--link-rate", default="1gbit", help="--net emulated: the link's rate (default %(default)s)")
    c.add_argument("--link-cc", default="", help="--net emulated: the hosts' TCP congestion control, e.g. cubic "
                   "(default: the machine's; calibration.json's link_cc says which one ran)")
    c.add_argument("--sizes", help="comma-separated message sizes (default 64 B to 16 MB by x4)")
    c.add_argument("--repeats", type=int, default=30, help="round trips per size (median taken)")
    c.add_argument("--overwrite", action="store_true", help="replace the calibration.json in --out (default: refuse)")
    c.set_defaults(func=cmd_calibrate)

    n = sub.add_parser("net", help="emulated-network housekeeping")
    nsub = n.add_subparsers(dest="net_cmd", required=True)
    nc = nsub.add_parser("cleanup", help="delete namespaces left by psring runs that died")
    nc.add_argument("--all", action="store_true", help="every psring namespace, even of runs still alive")
    nc.set_defaults(func=cmd_net)

    # listed for `psring --help`; cli.main hands `psring plot ...` to psring.plot_cli.main before parsing
    sub.add_parser("plot", help="regenerate the figures of a results folder from its CSVs (psring plot --help)")
