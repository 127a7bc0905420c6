"""Run notebooks from their jupytext sources and write the paired ``.ipynb`` with outputs.

Run: ``.venv/bin/python -m tests.notebook_run [NAME ...]`` (every notebook by default; the full
forms, or the quick ones under ``BLITZPLAN_QUICK=1``). ``make notebooks`` runs it. The tests use
:func:`execute` on the quick forms without writing anything.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).resolve().parents[1] / "notebooks"

TIMEOUT_S = 3600
"""The most one cell may take (the full forms solve to proven optimality at the paper's sizes)."""


def execute(source: Path, *, timeout_s: float = TIMEOUT_S) -> Any:
    """The notebook of ``source`` (a jupytext percent file), executed top to bottom in the
    notebooks folder; raises ``nbclient.exceptions.CellExecutionError`` on a failing cell."""
    import jupytext
    import nbclient

    notebook = jupytext.read(source)
    client = nbclient.NotebookClient(
        notebook,
        timeout=timeout_s,
        kernel_name="python3",
        resources={"metadata": {"path": str(source.parent)}},
    )
    client.execute()
    return notebook


def main(argv: list[str]) -> None:
    import jupytext

    names = argv or sorted(p.stem for p in FOLDER.glob("*.py"))
    for name in names:
        source = FOLDER / f"{name}.py"
        print(f"running {source.name}", flush=True)
        notebook = execute(source)
        jupytext.write(notebook, source.with_suffix(".ipynb"))


if __name__ == "__main__":
    main(sys.argv[1:])
