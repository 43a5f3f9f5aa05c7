"""``psring plot``'s command line, apart from ``psring.plot`` so that a mistyped folder or format is refused in
one line before matplotlib, pandas and torch are imported (seconds); ``psring.plot.plot_results`` draws."""
from __future__ import annotations

import sys
from pathlib import Path

from .fileio import out_folder
from .options import OneLineParser

KNOWN_FORMATS = ("png", "svg", "pdf")  # (plot.common.FORMATS: the default ones)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = OneLineParser(prog="psring plot", description="regenerate every figure of a results folder "
                                                       "from its committed data (psring.plot's docstring)")
    ap.add_argument("folder", help="a results folder, e.g. results/scaling")
    ap.add_argument("--calibration", metavar="FILE",
                    help="calibration.json for the cost model (default: FOLDER/calibration.json if present)")
    ap.add_argument("--formats", default="png,svg", help="comma-separated: png, svg, pdf (default png,svg)")
    ap.add_argument("--out", metavar="DIR", help="where to write the figures (default FOLDER/figures)")
    a = ap.parse_args(argv)
    formats = tuple(f.strip().lower() for f in a.formats.split(",") if f.strip())
    bad = [f for f in formats if f not in KNOWN_FORMATS]
    try:
        if bad or not formats:
            raise ValueError(f"unknown format(s) {','.join(bad) or a.formats!r}; use png, svg or pdf")
        if not a.folder.strip() or not Path(a.folder).is_dir():
            raise FileNotFoundError(f"{a.folder!r} is not a directory")
        if a.calibration:
            _check_calibration(a.calibration)
        if a.out is not None:
            out_folder(a.out)
        from .plot import plot_results

        paths = plot_results(a.folder, a.calibration, formats, a.out)
    except (FileNotFoundError, ValueError, KeyError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"psring plot: error: {msg}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


def _check_calibration(path: str) -> None:
    """``--calibration FILE`` readable as ``costmodel.load_calibration`` reads it, else one line naming it."""
    from .costmodel import load_calibration

    try:
        load_calibration(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        cause = e.strerror if isinstance(e, OSError) else f"missing {e}" if isinstance(e, KeyError) else e
        raise ValueError(f"--calibration {path}: not a readable calibration.json ({cause})") from None
