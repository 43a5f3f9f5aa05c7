"""Each config option declared once, as its dataclass field: default, help, section, flag and check.

The command line and the per-option checks are read from these declarations (a hand-rolled stand-in for
tyro or simple-parsing), so adding an option is one line in ``config.py``::

    @dataclass
    class Cfg:
        workers: int = opt(1, "number of workers N", section="run", short="-n", check=at_least(1))

    add_arguments(parser, Cfg, {"run": "run"}, "train")  # --workers/-n, in the argument group "run"
    cfg = from_namespace(Cfg, parser.parse_args())       # Cfg(workers=...)
    check_options(cfg)  # ConfigError("--workers must be >= 1, got 0")

The argparse type comes from the annotation (``int | None``: an int, or the default None; ``bool``: a
``--x`` switch, or ``--no-x`` where the default is True; ``tuple[float, float]``: two numbers;
``list[str]``: comma-separated). A field holding another declared dataclass (``nested``) contributes
that class's options; its flags keep their own names and their dests are dotted (``optim.lr``).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

COMMANDS = ("train", "worker")  # the sub-commands whose flags build a TrainConfig
_OPT, _NESTED = "psring.option", "psring.nested"


class ConfigError(ValueError):
    """A user-facing configuration problem; the CLI prints it on one line and exits with code 2."""


@dataclass(frozen=True)
class Option:
    """What a field's declaration says beyond its type and default. ``check(value)``: None when the value
    is fine, else the problem as the rest of a one-line message ("must be >= 1, got 0"); it is not run on
    None (an optional option left unset). ``commands``: the sub-commands that offer the flag."""

    help: str
    section: str
    check: Callable[[Any], str | None] | None = None
    choices: tuple[str, ...] | None = None
    flag: str | None = None
    short: str | None = None
    metavar: str | tuple[str, ...] | None = None
    commands: tuple[str, ...] = COMMANDS
    aliases: tuple[tuple[str, Any], ...] = ()  # (flag, value): a switch that sets the option to value


def opt(default, help: str, *, section: str, **kw):
    """A dataclass field declared as an option (``Option``'s fields as keywords)."""
    meta = {_OPT: Option(help, section, **kw)}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.copy(default), metadata=meta)
    return field(default=default, metadata=meta)


def nested(cls):
    """A field holding a ``cls`` whose own fields are declared options."""
    return field(default_factory=cls, metadata={_NESTED: True})


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser, its errors one line (``psring train: error: argument --steps: invalid int value:
    'nan' (psring train --help)``) where argparse prints the whole usage first, 34 lines for ``psring train``.
    Subcommands' parsers are of the same class (``add_subparsers``' default)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help)\n")


# --- checks -------------------------------------------------------------------------------------------
def at_least(low, note: str = "") -> Callable[[Any], str | None]:
    return lambda v: None if v >= low else f"must be >= {low}{note}, got {v!r}"


def above(low) -> Callable[[Any], str | None]:
    return lambda v: None if v > low else f"must be > {low}, got {v!r}"


def within(low, high) -> Callable[[Any], str | None]:
    return lambda v: None if low <= v < high else f"must be in [{low}, {high}), got {v!r}"


# --- reading the declarations ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Declared:
    """One declared option: its path from the outer config (``("optim", "lr")``), declaration and type."""

    path: tuple[str, ...]
    option: Option
    type: Any
    default: Any

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def dest(self) -> str:
        return ".".join(self.path)

    @property
    def flag(self) -> str:
        if self.option.flag:
            return self.option.flag
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.default is True else f"--{dashed}"

    def value(self, cfg) -> Any:
        for name in self.path:
            cfg = getattr(cfg, name)
        return cfg

    def shown(self, value) -> str:
        """The flag as a user would have given ``value``: ``--servers 2``, ``--no-overlap``."""
        if isinstance(value, bool):
            return self.flag
        return f"{self.flag} {','.join(map(str, value)) if isinstance(value, (list, tuple)) else value}"


def declared(cls, path: tuple[str, ...] = ()) -> Iterator[Declared]:
    """Every option of ``cls`` (and of its nested configs), in declaration order."""
    hints, defaults = typing.get_type_hints(cls), cls()
    for f in dataclasses.fields(cls):
        if f.metadata.get(_NESTED):
            yield from declared(hints[f.name], path + (f.name,))
        elif _OPT in f.metadata:
            yield Declared(path + (f.name,), f.metadata[_OPT], hints[f.name], getattr(defaults, f.name))


def undeclared(cls) -> list[str]:
    """The fields of ``cls`` (and of its nested configs) that lack a declaration: none, by test."""
    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if not f.metadata.get(_OPT) and not f.metadata.get(_NESTED)] \
        + [n for f in dataclasses.fields(cls) if f.metadata.get(_NESTED) for n in undeclared(hints[f.name])]


def _comma_list(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def _argparse_kind(d: Declared) -> dict:
    """add_argument's keywords for the type of ``d``."""
    tp = d.type
    args = typing.get_args(tp)
    if type(None) in args:  # X | None: an X, or the default None
        tp = next(a for a in args if a is not type(None))
    origin = typing.get_origin(tp)
    if tp is bool:
        return {"action": "store_false" if d.default else "store_true"}
    if origin is tuple:
        return {"type": typing.get_args(tp)[0], "nargs": len(typing.get_args(tp))}
    if origin is list:
        return {"type": _comma_list}
    return {"type": tp}


def _help(d: Declared) -> str:
    """The declared help, and the declared default where the help does not already say it (not argparse's
    ``%(default)s``: ``psring train`` chooses its --out later, so its parser's default is None)."""
    shown = d.default is not None and not isinstance(d.default, (bool, list)) and "default" not in d.option.help
    text = d.option.help + (" (default %(default)s)" if shown else "")
    return text.replace("%(default)s", str(d.default))


def add_arguments(p: argparse.ArgumentParser, cls, sections: dict[str, str], command: str) -> None:
    """``cls``'s options that ``command`` offers, one argument group per section (titles from
    ``sections``, in its order)."""
    groups = {name: p.add_argument_group(title) for name, title in sections.items()}
    for d in declared(cls):
        o = d.option
        if command not in o.commands:
            continue
        flags = [d.flag] + ([o.short] if o.short else [])
        kind = _argparse_kind(d)
        if "action" not in kind:  # LR, not argparse's OPTIM.LR from the dest
            kind["metavar"] = o.metavar or ("|".join(o.choices) if o.choices else d.flag[2:].upper().replace("-", "_"))
        groups[o.section].add_argument(*flags, dest=d.dest, default=d.default, help=_help(d), **kind)
        for flag, value in o.aliases:  # e.g. --no-overlap for --overlap none
            groups[o.section].add_argument(flag, dest=d.dest, action="store_const", const=value,
                                           help=f"the same as {d.flag} {value}")


def from_namespace(cls, ns: argparse.Namespace, path: tuple[str, ...] = ()):
    """A ``cls`` from parsed flags; an option the command does not offer, or left None where its
    default is not None (``psring train``'s --out, chosen later), keeps its default."""
    hints, kwargs = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        if f.metadata.get(_NESTED):
            kwargs[f.name] = from_namespace(hints[f.name], ns, path + (f.name,))
            continue
        dest = ".".join(path + (f.name,))
        value = getattr(ns, dest, None)
        if value is not None or (hasattr(ns, dest) and f.default is None):
            kwargs[f.name] = value
    return cls(**kwargs)


def _finite(v) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:  # an int beyond any float (a TOML file's 1 followed by 400 zeros)
        return False


def _kind(v, tp) -> str | None:
    """What ``v`` must be to fit the type ``tp`` (``an integer``, ``a finite number``, ...), or None if it
    does: a value from a sweep file or a config file, which no argparse typed. Not a bool for a number."""
    args, origin = typing.get_args(tp), typing.get_origin(tp)
    if type(None) in args:  # X | None
        return None if v is None else _kind(v, next(a for a in args if a is not type(None)))
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    if tp is int:
        return None if isinstance(v, int) and not isinstance(v, bool) else "an integer"
    if tp is float:
        return None if number and _finite(v) else "a finite number"
    if tp in (str, bool):
        return None if isinstance(v, tp) else {str: "text", bool: "true or false"}[tp]
    if origin in (tuple, list):
        each = args[0] if origin is list else None
        ok = isinstance(v, (list, tuple)) and (origin is list or len(v) == len(args))
        ok = ok and all(_kind(x, each or args[i]) is None for i, x in enumerate(v))
        return None if ok else (f"{len(args)} values" if origin is tuple else "a list") + " of the right kind"
    return None


def check_options(cfg, only: tuple[str, ...] | None = None) -> None:
    """Every declared option's type (``_kind``) and own check (choices, then ``check``), in declaration
    order: the first problem as a ``ConfigError`` naming its flag. ``only``: just the options at these
    dests, after every option's type (a sweep file's ``workers = "two"`` fails here, not in a comparison)."""
    for d in declared(type(cfg)):
        if (kind := _kind(d.value(cfg), d.type)) is not None:  # (a file's eval = "yes": name eval, not --no-eval)
            who = f"{d.name} ({d.flag})" if d.flag.startswith("--no-") else d.flag
            raise ConfigError(f"{who} must be {kind}, got {d.value(cfg)!r}")
    for d in declared(type(cfg)):
        if only is not None and d.dest not in only:
            continue
        v = d.value(cfg)
        if v is None:
            continue
        if d.option.choices is not None and v not in d.option.choices:
            raise ConfigError(f"{d.flag} must be one of {', '.join(d.option.choices)}, got {v!r}")
        problem = d.option.check(v) if d.option.check else None
        if problem:
            raise ConfigError(f"{d.flag} {problem}")


def off_default(cfg, section: str) -> Iterator[tuple[Declared, Any]]:
    """The options of ``section`` that ``cfg`` sets to something else than their default."""
    for d in declared(type(cfg)):
        if d.option.section == section and d.value(cfg) != d.default:
            yield d, d.value(cfg)
