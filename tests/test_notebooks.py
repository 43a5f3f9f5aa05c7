"""Every notebook under notebooks/ runs top to bottom, headless, without an error, and is committed
with its outputs cleared.

The notebooks are executed in memory with nbclient (nothing is written back into the repository), with
the notebooks directory as the working directory and matplotlib's non-interactive Agg backend. They
read only the committed results/ folders, so all of them together take well under two minutes.

The kernel is always *this* interpreter: the test writes a ``python3`` kernelspec that starts
``sys.executable -m ipykernel_launcher`` into a temporary directory and puts it first on JUPYTER_PATH.
Whatever other ``python3`` kernelspecs the machine has (a user-level one pointing at another Python
without psring, or none at all) cannot then change which Python runs the notebook.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
ipykernel_kernelspec = pytest.importorskip("ipykernel.kernelspec")

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 120
KERNEL = "python3"


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no *.ipynb in {NOTEBOOK_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_clean(path: Path):
    """Outputs cleared (small diffs, no stale figures) and a markdown cell first that says what it shows."""
    nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
    nbformat.validate(nb)
    assert nb.cells and nb.cells[0].cell_type == "markdown", f"{path.name}: start with a markdown cell"
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: clear the outputs of cells {dirty}"
    assert nb.metadata.get("kernelspec", {}).get("name") == KERNEL


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """A ``python3`` kernelspec for the current interpreter, found before any other; headless matplotlib."""
    kernels = tmp_path / "jupyter" / "kernels"
    kernels.mkdir(parents=True)
    ipykernel_kernelspec.write_kernel_spec(kernels / KERNEL)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))  # connection files
    monkeypatch.setenv("MPLBACKEND", "Agg")
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(KERNEL)
    assert spec.argv[0] == sys.executable, spec.argv


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, kernel_env):
    source = path.read_bytes()
    before = sorted(NOTEBOOK_DIR.rglob("*"))
    nb = nbformat.reads(source.decode("utf-8"), as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=CELL_TIMEOUT_S,
                                     resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    error = None
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:
        error = e
    if error is not None:  # outside the except block, so the report is the cell's traceback alone
        pytest.fail(f"{path.name} failed:\n{error}", pytrace=False)
    assert path.read_bytes() == source, f"{path.name} was modified by running it"
    assert sorted(NOTEBOOK_DIR.rglob("*")) == before, f"{path.name} wrote files into {NOTEBOOK_DIR}"
