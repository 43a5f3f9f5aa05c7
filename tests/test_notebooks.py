"""Every notebook under notebooks/ is committed executed, so that a reader browsing the repository sees
its tables and figures, and a fresh headless run of it succeeds and prints what the committed file shows.

The committed file: every code cell has run, in order, in one kernel (execution counts 1, 2, ...) and
shows at least one output, none of them an error; figures are PNG only and small; no execution timings
or widget state. ``python notebooks/execute.py`` writes the files this way.

The fresh run: each notebook is executed in memory by that script's own ``run`` (nbclient, this folder
as the working directory, matplotlib's Agg backend, the kernel *this* interpreter through a ``python3``
kernelspec for ``sys.executable`` first on a temporary JUPYTER_PATH, so that no other kernelspec of the
machine can change which Python runs it). Nothing is written into the repository. What its cells print
(streams and the text of their results, not the pixels of figures) must equal the committed outputs:
a notebook edited, or data or code it reads changed, without re-executing it fails here. The notebooks
read only the committed results/ folders, so all of them together take well under a minute.
"""
from __future__ import annotations

import base64
import concurrent.futures
import difflib
import importlib.util
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
KERNEL = "python3"
MAX_IMAGE_BYTES = 200_000
MAX_NOTEBOOK_BYTES = 2_000_000
IMAGE_MIMES = ("image/png", "image/jpeg", "image/gif", "image/svg+xml", "application/pdf")


def load_execute_script():
    """notebooks/execute.py as a module (no package there), without a __pycache__ in notebooks/."""
    spec = importlib.util.spec_from_file_location("notebooks_execute", NOTEBOOK_DIR / "execute.py")
    module = importlib.util.module_from_spec(spec)
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = saved
    return module


def read(path: Path):
    return nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)


def code_cells(nb) -> list[tuple[int, dict]]:
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def printed(cell) -> str:
    """What a code cell shows as text: its streams, and the text/plain of its results and displays."""
    return "".join(o.get("text", "") if o.output_type == "stream"
                   else o.get("data", {}).get("text/plain", "") + "\n" for o in cell.get("outputs", []))


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no *.ipynb in {NOTEBOOK_DIR}"
    assert (NOTEBOOK_DIR / "execute.py").is_file()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_executed(path: Path):
    """Executed top to bottom, every code cell showing something, no errors, small PNG figures only."""
    fix = f"; run python notebooks/execute.py {path.stem}"
    assert path.stat().st_size < MAX_NOTEBOOK_BYTES, f"{path.name}: {path.stat().st_size:,} bytes, too large"
    nb = read(path)
    nbformat.validate(nb)
    assert nb.cells and nb.cells[0].cell_type == "markdown", f"{path.name}: start with a markdown cell"
    assert nb.metadata.get("kernelspec", {}).get("name") == KERNEL
    assert "widgets" not in nb.metadata, f"{path.name}: widget state committed{fix}"
    cells = code_cells(nb)
    counts = [c.get("execution_count") for _, c in cells]
    assert counts == list(range(1, len(cells) + 1)), f"{path.name}: not executed top to bottom in one go " \
                                                      f"(execution counts {counts}){fix}"
    silent = [i for i, c in cells if not c.outputs]
    assert not silent, f"{path.name}: code cells {silent} show no output (end each with what it computed)"
    errors = [i for i, c in cells if any(o.output_type == "error" for o in c.outputs)]
    assert not errors, f"{path.name}: cells {errors} committed with an error"
    timed = [i for i, c in enumerate(nb.cells) if "execution" in c.metadata]
    assert not timed, f"{path.name}: cells {timed} carry execution timings{fix}"
    for i, c in cells:
        for o in c.outputs:
            data = o.get("data", {})
            other = [m for m in data if m in IMAGE_MIMES and m != "image/png"]
            assert not other, f"{path.name}, cell {i}: figures as PNG only, not {other}"
            if "image/png" in data:
                size = len(base64.b64decode(data["image/png"]))
                assert size < MAX_IMAGE_BYTES, f"{path.name}, cell {i}: a {size:,}-byte PNG; lower its DPI"


RUN_AT_ONCE = 2  # notebooks executed side by side: each kernel is one single-threaded process, 2 cores here


@pytest.fixture(scope="module")
def fresh_runs():
    """Every notebook executed by notebooks/execute.py's own ``run`` inside its kernel environment, two at a
    time: {path: the executed notebook, or the NotebookError}, and whether anything in notebooks/ changed."""
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel.kernelspec")
    pytest.importorskip("ipywidgets")  # notebook 04's sliders; without it the notebook prints other text
    script = load_execute_script()
    with script.kernel_env():
        from jupyter_client.kernelspec import KernelSpecManager

        spec = KernelSpecManager().get_kernel_spec(KERNEL)
        assert spec.argv[0] == sys.executable, spec.argv
        sources = {p: p.read_bytes() for p in NOTEBOOKS}
        before = sorted(NOTEBOOK_DIR.rglob("*"))

        def one(path: Path):
            nb = read(path)
            try:
                return script.clean(script.run(nb, path.name))
            except script.NotebookError as e:
                return e

        with concurrent.futures.ThreadPoolExecutor(RUN_AT_ONCE) as pool:
            runs = dict(zip(NOTEBOOKS, pool.map(one, NOTEBOOKS)))
        changed = [p.name for p in NOTEBOOKS if p.read_bytes() != sources[p]]
        wrote = sorted(NOTEBOOK_DIR.rglob("*")) != before
    yield runs, changed, wrote


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, fresh_runs):
    runs, changed, wrote = fresh_runs
    nb = runs[path]
    if isinstance(nb, Exception):
        pytest.fail(str(nb), pytrace=False)
    assert path.name not in changed, f"{path.name} was modified by running it"
    assert not wrote, f"running the notebooks wrote files into {NOTEBOOK_DIR}"
    committed = dict(code_cells(read(path)))
    stale = [i for i, c in code_cells(nb) if printed(c) != printed(committed[i])]
    if stale:
        i = stale[0]
        diff = difflib.unified_diff(printed(committed[i]).splitlines(), printed(nb.cells[i]).splitlines(),
                                    "committed", "fresh run", lineterm="")
        diff = "\n".join(list(diff)[:30])
        pytest.fail(f"{path.name}: cells {stale} print other text than their committed outputs; re-run "
                    f"python notebooks/execute.py {path.stem}\ncell {i}:\n{diff}", pytrace=False)
