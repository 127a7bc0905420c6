"""Notebooks are paired: a jupytext source (``notebooks/*.py``, percent format) that reviews as
plain text, and the executed ``.ipynb`` with its outputs that a reader sees on a code host. The
two hold the same cells, the committed notebook was run to the end, and every source runs
headless, top to bottom, with BLITZPLAN_QUICK=1 (``make notebooks``, i.e. ``python -m
tests.notebook_run``, re-executes the full forms and rewrites the ``.ipynb`` files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.notebook_run import FOLDER, execute

SOURCES = sorted(FOLDER.glob("*.py"))


def _cells(notebook: object) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source.strip()) for cell in notebook.cells]  # type: ignore[attr-defined]


def test_every_notebook_is_a_pair_and_there_is_a_quickstart() -> None:
    assert FOLDER / "quickstart.py" in SOURCES
    assert {p.stem for p in FOLDER.glob("*.ipynb")} == {p.stem for p in SOURCES}
    assert not list(FOLDER.glob("make_*.py")), "notebooks are jupytext sources, not builders"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_the_pair_is_in_sync_and_was_run(source: Path) -> None:
    jupytext = pytest.importorskip("jupytext")
    nbformat = pytest.importorskip("nbformat")
    text = jupytext.read(source)
    assert text.metadata["jupytext"]["formats"] == "ipynb,py:percent"
    committed = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    assert _cells(text) == _cells(committed), f"run: jupytext --sync {source.name}"
    code = [cell for cell in committed.cells if cell.cell_type == "code"]
    assert all(cell.get("execution_count") for cell in code), f"{source.stem}.ipynb was not run"
    outputs = [out for cell in code for out in cell.get("outputs", [])]
    assert outputs, f"{source.stem}.ipynb has no outputs"
    assert not [out for out in outputs if out.get("output_type") == "error"]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_notebook_executes(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("jupytext")
    pytest.importorskip("nbclient")
    monkeypatch.setenv("BLITZPLAN_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = execute(source, timeout_s=300)  # raises on the first failing cell
    shown = [
        out
        for cell in notebook.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    ]
    assert shown, f"{source.name} showed nothing"
