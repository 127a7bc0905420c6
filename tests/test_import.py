"""``import blitzplan`` stays light: no solver backend, torch or ray at import."""

from __future__ import annotations

import subprocess
import sys


def test_import_pulls_no_heavy_dependency() -> None:
    code = (
        "import sys, blitzplan\n"
        "heavy = [m for m in ('torch', 'pulp', 'ortools', 'ray', 'highspy') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def test_public_names_exist() -> None:
    import blitzplan

    for name in blitzplan.__all__:
        assert hasattr(blitzplan, name), name
