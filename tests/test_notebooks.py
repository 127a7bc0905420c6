"""Every notebook under notebooks/ runs headless, top to bottom, with BLITZPLAN_QUICK=1."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_there_is_a_quickstart() -> None:
    assert REPO / "notebooks" / "quickstart.ipynb" in NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("BLITZPLAN_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    printed = "".join(
        out.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    )
    assert printed, f"{path.name} printed nothing"
