"""``psring bench``'s command line: flags over the [bench] table of a TOML file over defaults (kept apart
from ``psring/cli.py`` so that each file stays about one thing)."""
from __future__ import annotations

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


# the [bench] keys by the kind of value they take (any other: text)
INT_KEYS, BOOL_KEYS = ("workers", "factor", "warmup", "iters"), ("floor", "force")
SIZE_KEYS, LIST_KEYS = ("min_size", "max_size", "chunk", "sizes"), ("sizes", "strategies")
RESULTS = ("bench.csv", "bench.txt")  # what a finished bench leaves in --out


def file_value_problem(key: str, v) -> str | None:
    """What is wrong with the kind of ``v`` for [bench] ``key`` (``must be ...``), or None."""
    def scalar(x) -> bool:
        return isinstance(x, str) or (key in SIZE_KEYS and isinstance(x, int) and not isinstance(x, bool))

    if key in INT_KEYS:
        return None if isinstance(v, int) and not isinstance(v, bool) else "must be a whole number"
    if key in BOOL_KEYS:
        return None if isinstance(v, bool) else "must be true or false"
    if key in LIST_KEYS and isinstance(v, list):
        return None if v and all(map(scalar, v)) else "must be a non-empty list of " + (
            "sizes (e.g. \"4K\" or 4096)" if key in SIZE_KEYS else "strings")
    if scalar(v):
        return None
    return "must be a size such as \"4K\" or 4096" if key in SIZE_KEYS else "must be a string"


def read_bench_table(file: str) -> dict:
    """The [bench] table of ``file``: every way it can be unreadable or wrong is one ConfigError line."""
    from ..fileio import read_toml

    table = read_toml(file, "bench file").get("bench")
    if not isinstance(table, dict):
        raise ConfigError(f"{file}: " + ("no [bench] table: psring bench FILE takes its settings from one "
                                         "(e.g. experiments/message_size.toml)" if table is None else
                                         f"bench must be a table ([bench] ...), got bench = {table!r}"))
    unknown = set(table) - set(BENCH_DEFAULTS)
    if unknown:
        raise ConfigError(f"{file}: unknown key(s) in [bench]: {', '.join(sorted(unknown))}")
    for key, v in table.items():
        problem = file_value_problem(key, v)
        if problem:
            raise ConfigError(f"{file}: [bench] {key} {problem}, got {v!r}")
    return table


def bench_settings(a) -> dict:
    """Flags given on the command line win over the [bench] table of FILE, which wins over defaults.
    ``_from``: the keys whose value is FILE's (``named`` names them so in an error)."""
    settings, table = dict(BENCH_DEFAULTS), read_bench_table(a.file) if a.file else {}
    settings.update({k: ",".join(map(str, v)) if isinstance(v, list) else v for k, v in table.items()})
    flags = {k: v for k, v in vars(a).items() if k in settings and v is not None}
    settings.update(flags)
    settings["_from"] = {k: a.file for k in table if k not in flags}
    return settings


def named(b: dict, key: str) -> str:
    """How an error names setting ``key``: ``--min-size``, or ``FILE: [bench] min_size`` where it came from."""
    file = b.get("_from", {}).get(key)
    return f"{file}: [bench] {key}" if file else "--" + key.replace("_", "-")


def read_size(b: dict, key: str, text) -> int:
    """One size of setting ``key`` (``4K``, 4096), or one ConfigError line naming it."""
    from .runner import parse_size

    try:
        return parse_size(str(text))
    except ValueError as e:
        raise ConfigError(f"{named(b, key)}: {e}") from None


def bench_sizes(b: dict) -> list[int]:
    """The message sizes: ``sizes``, else ``min_size`` to ``max_size`` by ``factor`` (checked first)."""
    from .runner import size_range

    if b["sizes"] is not None:
        if not str(b["sizes"]).strip():
            raise ConfigError(f"{named(b, 'sizes')} is empty: give comma-separated sizes, e.g. 4K,1M,44M")
        return [read_size(b, "sizes", x) for x in str(b["sizes"]).split(",")]
    lo, hi = read_size(b, "min_size", b["min_size"]), read_size(b, "max_size", b["max_size"])
    if lo > hi:
        raise ConfigError(f"the smallest size {b['min_size']} ({named(b, 'min_size')}) is above the largest "
                          f"{b['max_size']} ({named(b, 'max_size')}): swap them, or give --sizes")
    return size_range(lo, hi, b["factor"])


def check_counts(b: dict) -> None:
    """The counts, each named in one line (before ``size_range``, which a factor below 2 would never end)."""
    for key, low in (("workers", 1), ("iters", 1), ("warmup", 0), ("factor", 2)):
        if b[key] < low:
            raise ConfigError(f"{named(b, key)} must be >= {low}, got {b[key]}")


def cmd_bench(a) -> int:
    from .runner import run_bench

    b = bench_settings(a)
    check_counts(b)
    sizes, chunk = bench_sizes(b), read_size(b, "chunk", b["chunk"])
    strategies = [x for x in str(b["strategies"]).split(",") if x]
    bad = set(strategies) - set(benchable())
    if bad or not strategies:
        also = [n for n in benchable() if n not in default_benched()]
        raise ConfigError(f"--strategies takes {' and/or '.join(default_benched())}"
                          + (f" (the default; also {', '.join(also)})" if also else "")
                          + f", got {b['strategies']!r}")
    if b["model"] is not None and b["model"] not in MODELS:
        raise ConfigError(f"--model must be one of {', '.join(MODELS)}, got {b['model']!r}")
    check_bench_codec(str(b["compress"]), strategies)
    from ..launch.outdir import refuse_results

    # (run_bench makes --out, or says why not, after its memory check)
    refuse_results(b["out"], RESULTS, "a finished bench", bool(a.overwrite))
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
    b.add_argument("--overwrite", action="store_true",
                   help="replace the finished bench in --out (bench.csv; default: refuse, exit 2)")
    b.add_argument("--force", action="store_const", const=True,
                   help="start even if the measured memory footprint says this machine cannot hold it")
    b.set_defaults(func=cmd_bench)
