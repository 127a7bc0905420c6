"""Every benchmark script runs to completion in quick mode (its numbers live in the README)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPTS = sorted((REPO / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_benchmark_runs_quick(script: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "BLITZPLAN_QUICK": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "---" in result.stdout, "a benchmark prints at least one table"
