"""Re-execute the teaching notebooks in place, so that the committed files show their tables and figures.

Usage, from the repository root in the project's venv (``pip install -e '.[test]'``)::

    python notebooks/execute.py                   # every notebooks/*.ipynb, in name order
    python notebooks/execute.py 04_cost_model     # only those named: file name, with or without .ipynb,
    python notebooks/execute.py notebooks/01_first_comparison.ipynb   # or a path

Each notebook runs top to bottom with nbclient, headless: the working directory is this folder (the
notebooks read ``../results/...``), the kernel is *this* interpreter (a ``python3`` kernelspec for
``sys.executable`` written into a temporary JUPYTER_PATH, found before any other), and MPLBACKEND=Agg.
A notebook's first code cell turns on the inline backend itself (``%matplotlib inline``, PNG only, a
modest ``DPI``), so that it looks the same here and in Jupyter. The outputs are written back into the
``.ipynb``, with whatever would change from one run to the next on the same data left out, so that
re-running gives the same file: no execution timings, no widget state or widget views (a widget needs a
live frontend; a notebook with sliders draws a static figure beside them), no Python patch version, and
PNGs re-encoded with a 256-colour palette and without matplotlib's version (``shrink_png``: a third of
the size). Run it after editing a notebook or changing what one reads; ``tests/test_notebooks.py``
checks that the committed text outputs are those a fresh run prints.

Exit status 0 when every notebook ran; otherwise 1 with one line naming the notebook and the cell that
failed (that notebook is left as it was), or 2 for a name that is no notebook here.
"""
from __future__ import annotations

import base64
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOK_DIR = Path(__file__).resolve().parent
KERNEL = "python3"
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": KERNEL}
CELL_TIMEOUT_S = 120
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
VOLATILE_CELL_METADATA = ("execution", "ExecuteTime", "collapsed", "scrolled")


class NotebookError(RuntimeError):
    """A cell of a notebook failed; the message is one line: notebook, cell, exception."""


def notebooks(names: list[str] | None = None) -> list[Path]:
    """Every ``*.ipynb`` here (name order), or those ``names`` give; ValueError for an unknown one."""
    found = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
    if not names:
        return found
    by_name = {p.name: p for p in found}
    chosen = []
    for name in names:
        file = Path(name).name
        file = file if file.endswith(".ipynb") else f"{file}.ipynb"
        if file not in by_name:
            raise ValueError(f"no notebook {name!r} in {NOTEBOOK_DIR}; one of {', '.join(by_name)}")
        chosen.append(by_name[file])
    return chosen


@contextlib.contextmanager
def kernel_env():
    """A ``python3`` kernelspec for this interpreter first on JUPYTER_PATH, connection files in a
    temporary directory, headless matplotlib; the environment is restored afterwards."""
    from ipykernel.kernelspec import write_kernel_spec

    keys = ("JUPYTER_PATH", "JUPYTER_RUNTIME_DIR", "MPLBACKEND")
    saved = {k: os.environ.get(k) for k in keys}
    with tempfile.TemporaryDirectory(prefix="psring-nb-") as tmp:
        write_kernel_spec(Path(tmp) / "jupyter" / "kernels" / KERNEL)
        os.environ.update(JUPYTER_PATH=str(Path(tmp) / "jupyter"),
                          JUPYTER_RUNTIME_DIR=str(Path(tmp) / "runtime"),  # connection files
                          MPLBACKEND="Agg")
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def run(nb, name: str):
    """Execute ``nb`` (in place, and return it) in this folder; NotebookError naming the cell when one
    fails, times out or kills the kernel. Call inside ``kernel_env()``."""
    current = {"index": -1}

    def on_cell_start(cell, cell_index, **_):
        current["index"] = cell_index

    # store_widget_state must stay on: nbclient's Output-widget capture (ipywidgets.interactive) needs
    # it (KeyError without); clean() drops the state afterwards.
    client = NotebookClient(nb, kernel_name=KERNEL, timeout=CELL_TIMEOUT_S, record_timing=False,
                            store_widget_state=True, on_cell_start=on_cell_start,
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    try:
        client.execute()
    except Exception as e:  # a cell's error, a timeout, a dead kernel: one line that says where
        i = current["index"]
        line = (nb.cells[i].source.strip().splitlines() or [""])[0] if i >= 0 else ""
        what = f"{e.ename}: {e.evalue}" if isinstance(e, CellExecutionError) else f"{type(e).__name__}: {e}"
        what = (what.strip().splitlines() or [type(e).__name__])[0]
        raise NotebookError(f"{name}: cell {i} ({line!r}) failed: {what}") from None
    return nb


def clean(nb):
    """Strip (in place, and return) what changes between runs on the same data: timings and other
    per-session cell metadata, widget state and widget views, the kernel's patch version."""
    nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata.get("language_info", {}).pop("version", None)
    for cell in nb.cells:
        for key in VOLATILE_CELL_METADATA:
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if WIDGET_VIEW not in o.get("data", {})]
            for o in cell.outputs:
                o.pop("transient", None)
    return nb


def shrink_png(b64: str) -> str:
    """An opaque PNG (base64) re-encoded with a 256-colour palette, without matplotlib's version text:
    a third of the size, indistinguishable for line plots (mean error < 1/1000 of the range here).
    Images with transparency, or that would not get smaller, are returned unchanged."""
    from PIL import Image

    with Image.open(io.BytesIO(base64.b64decode(b64))) as im:
        if im.mode not in ("RGB", "RGBA") or (im.mode == "RGBA" and im.getchannel("A").getextrema()[0] < 255):
            return b64
        palette = im.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    buf = io.BytesIO()
    palette.save(buf, format="PNG", optimize=True)
    small = base64.b64encode(buf.getvalue()).decode("ascii")
    return small if len(small) < len(b64) else b64


def shrink_images(nb):
    """``shrink_png`` every PNG output of ``nb`` (in place, and return it)."""
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if "image/png" in o.get("data", {}):
                o["data"]["image/png"] = shrink_png(o["data"]["image/png"])
    return nb


def execute_file(path: Path) -> float:
    """Run the notebook at ``path`` and write it back with its outputs; the seconds it took."""
    start = time.monotonic()
    nb = nbformat.read(path, as_version=4)
    shrink_images(clean(run(nb, path.name)))
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    names = sys.argv[1:] if argv is None else argv
    try:
        paths = notebooks(names)
    except ValueError as e:
        print(f"execute.py: {e}", file=sys.stderr)
        return 2
    with kernel_env():
        for path in paths:
            try:
                seconds = execute_file(path)
            except NotebookError as e:
                print(f"execute.py: {e}", file=sys.stderr)
                return 1
            print(f"{path.name}: {seconds:.1f} s, {path.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
