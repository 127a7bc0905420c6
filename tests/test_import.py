"""``import blitzplan`` stays light: no solver backend, torch or ray at import."""

from __future__ import annotations

import subprocess
import sys


def fresh_python(code: str) -> str:
    """What ``code`` prints in a fresh interpreter; it must exit 0 (its stderr says why not)."""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_import_pulls_no_heavy_dependency() -> None:
    code = (
        "import sys, blitzplan\n"
        "heavy = [m for m in ('torch', 'pulp', 'ortools', 'ray', 'highspy') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    assert fresh_python(code).strip() == ""


def test_public_names_exist() -> None:
    import blitzplan

    for name in blitzplan.__all__:
        assert hasattr(blitzplan, name), name


_BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('pulp', 'highspy', 'ortools', 'torch', 'ray', 'matplotlib'):
            raise ImportError(f'{name} is not installed (blocked)')
sys.meta_path.insert(0, Block())
"""


def test_the_core_install_plans_without_the_extras() -> None:
    """What a control loop needs (plan() with greedy and ZigZag, replan, JSON) runs with no
    exact solver, torch, Ray or matplotlib installed; an exact schedule says which extra."""
    code = _BLOCK + (
        "import blitzplan\n"
        "from blitzplan.errors import SolverUnavailableError\n"
        "s = blitzplan.ClusterState(blitzplan.load_topology('paper-a800-32'),"
        " models=['mistral-small-24b'])\n"
        "s.add_instance('mistral-small-24b', gpus=['h0/gpu0', 'h0/gpu1'], role='prefill',"
        " queue=[(0.0, 2048)] * 4)\n"
        "s.add_instance('mistral-small-24b', gpus=['h0/gpu2', 'h0/gpu3'], role='decode')\n"
        "p = blitzplan.plan(s, blitzplan.ScaleRequest('mistral-small-24b', prefill=2, tp=2))\n"
        "assert p.new_instances and p.live_pairs and p.steps\n"
        "blitzplan.ScalePlan.from_json(p.to_json())\n"
        "blitzplan.replan(p, s, at_s=0.2, failed=['i1'])\n"
        "from blitzplan.scale.pairing import live_instance\n"
        "inst = live_instance(s, p.spec, p.new_instances[0].gpus,"
        " p.new_instances[0].layer_ready_s, s.instances[0], list(s.instances[0].queue),"
        " blitzplan.scale.PlanOptions(), 2)\n"
        "try:\n"
        "    blitzplan.schedule_live(inst, method='exact', backend='highs')\n"
        "except SolverUnavailableError as exc:\n"
        "    print('refused:', exc)\n"
    )
    out = fresh_python(code)
    assert "refused:" in out and "blitzplan[exact]" in out
