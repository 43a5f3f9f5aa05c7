"""``psring bench``'s command line: flags over the [bench] table of a TOML file over defaults (kept apart
from ``psring/cli.py`` so that each file stays about one thing)."""
from __future__ import annotations

from pathlib import Path

from ..config import MODELS, ConfigError
from ..strategies import REGISTRY, names, uses_servers

# The raw transports of bench.csv's "strategy" column (the rows of a strategy's timed counterpart; a
# strategy names its own in the registry, ``Strategy.bench_raw``): not strategies, so kept here, once.
RAW_ALLREDUCE = "raw_allreduce"  # one dist.all_reduce of a flat tensor of M bytes
RAW_ZMQ_ECHO = "raw_zmq_echo"  # a ZeroMQ echo of M bytes in pipelined frames to the same S servers
RAW_ZMQ_ECHO_SGD = "raw_zmq_echo_sgd"  # echo servers that also run the SGD update (``--floor``)
FLOOR_OF = {RAW_ZMQ_ECHO: RAW_ZMQ_ECHO_SGD}  # a raw transport -> its floor (the transport + the update)
RAW_LABELS = {RAW_ALLREDUCE: "raw dist.all_reduce", RAW_ZMQ_ECHO: "raw ZeroMQ echo",
              RAW_ZMQ_ECHO_SGD: "raw ZeroMQ echo + SGD update"}


def benchable() -> list[str]:
    """The strategies ``psring bench`` times (those with a ``bench_raw``): without servers first, each
    group in registry order (allreduce, then ps)."""
    reg = names()
    return sorted((n for n, s in REGISTRY.items() if s.bench_raw),
                  key=lambda n: (uses_servers(n), reg.index(n)))


def default_benched() -> list[str]:
    """What ``psring bench`` times without ``--strategies``: each raw transport once, beside the first
    strategy of ``benchable()`` timed against it (allreduce, ps); the others (ring) on request."""
    first: dict[str, str] = {}
    for n in benchable():
        first.setdefault(REGISTRY[n].bench_raw, n)
    return list(first.values())


BENCH_DEFAULTS = {"workers": 2, "strategies": ",".join(default_benched()), "min_size": "4K",
                  "max_size": "128M", "factor": 4, "sizes": None, "warmup": 5, "iters": 20, "chunk": "1M",
                  "out": "results/bench", "model": None, "floor": False, "force": False,
                  "compress": "none"}


def bench_settings(a) -> dict:
    """Flags given on the command line win over the [bench] table of FILE, which wins over defaults."""
    settings = dict(BENCH_DEFAULTS)
    if a.file:
        import tomllib

        try:
            table = tomllib.loads(Path(a.file).read_text()).get("bench", {})
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read bench file {a.file}: {e}") from None
        unknown = set(table) - set(settings)
        if unknown:
            raise ConfigError(f"{a.file}: unknown key(s) in [bench]: {', '.join(sorted(unknown))}")
        settings.update({k: ",".join(map(str, v)) if isinstance(v, list) else v for k, v in table.items()})
    settings.update({k: v for k, v in vars(a).items() if k in settings and v is not None})
    return settings


def cmd_bench(a) -> int:
    from .runner import parse_size, run_bench, size_range

    b = bench_settings(a)
    try:
        if b["sizes"]:
            sizes = [parse_size(str(x)) for x in str(b["sizes"]).split(",")]
        else:
            sizes = size_range(parse_size(str(b["min_size"])), parse_size(str(b["max_size"])), int(b["factor"]))
        chunk = parse_size(str(b["chunk"]))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    strategies = [x for x in str(b["strategies"]).split(",") if x]
    bad = set(strategies) - set(benchable())
    if bad or not strategies:
        also = [n for n in benchable() if n not in default_benched()]
        raise ConfigError(f"--strategies takes {' and/or '.join(default_benched())}"
                          + (f" (the default; also {', '.join(also)})" if also else "")
                          + f", got {b['strategies']!r}")
    if b["workers"] < 1 or b["iters"] < 1 or b["warmup"] < 0 or not sizes or b["factor"] < 2:
        raise ConfigError("need --workers >= 1, --iters >= 1, --warmup >= 0, --factor >= 2 and at least one size")
    if b["model"] is not None and b["model"] not in MODELS:
        raise ConfigError(f"--model must be one of {', '.join(MODELS)}, got {b['model']!r}")
    check_bench_codec(str(b["compress"]), strategies)
    run_bench(b["workers"], sizes, strategies, b["out"], b["warmup"], b["iters"], chunk, model=b["model"],
              floor=bool(b["floor"]), force=bool(b["force"]), compress=str(b["compress"]))
    return 0



def check_bench_codec(spec: str, strategies: list[str]) -> None:
    """``--compress`` names a codec every benched strategy takes (``Strategy.codecs``), in one line."""
    from ..compress.spec import NONE, check_spec

    try:
        check_spec(spec)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    name = spec.partition(":")[0]
    refusing = [n for n in strategies if name != NONE and name not in REGISTRY[n].codecs]
    if refusing:
        raise ConfigError(f"--compress {spec}: {', '.join(refusing)} cannot bench it "
                          f"(they take {', '.join(REGISTRY[refusing[0]].codecs) or 'no codec'})")


def add_bench_parser(sub) -> None:
    """``psring bench``'s sub-parser, on the ``add_subparsers`` object of ``psring``."""
    b = sub.add_parser("bench", help="synchronizers alone vs their raw transports, per message size")
    b.add_argument("file", nargs="?", help="optional TOML with a [bench] table, e.g. experiments/message_size.toml")
    b.add_argument("--workers", "-n", type=int, help="workers N (default 2)")
    b.add_argument("--strategies",
                   help=f"comma-separated, of {', '.join(benchable())} (with servers: S=1 and S=N); "
                        f"default {','.join(default_benched())}")
    b.add_argument("--min-size", help="default 4K")
    b.add_argument("--max-size", help="default 128M")
    b.add_argument("--factor", type=int, help="size step between --min-size and --max-size (default 4)")
    b.add_argument("--sizes", help="explicit comma-separated sizes, e.g. 4K,1M,44M (overrides the range)")
    b.add_argument("--warmup", type=int, help="untimed iterations per size (default 5)")
    b.add_argument("--iters", type=int, help="timed iterations per size (default 20)")
    b.add_argument("--chunk", help="frame size of the raw ZeroMQ echo (default 1M)")
    b.add_argument("--out", help="output directory (default results/bench)")
    b.add_argument("--model", help="bench this model's gradient set (its real tensors) instead of sizes")
    b.add_argument("--floor", action="store_const", const=True,
                   help="ps: also time echo servers that run the SGD update (raw_zmq_echo_sgd), the PS's floor")
    b.add_argument("--compress", metavar="CODEC",
                   help="time the strategies with this gradient codec (fp16, bf16, topk:R, randomk:R, onebit); "
                        "the raw transports stay dense: the ratio is what the codec saves over them")
    b.add_argument("--force", action="store_const", const=True,
                   help="start even if the measured memory footprint says this machine cannot hold it")
    b.set_defaults(func=cmd_bench)
