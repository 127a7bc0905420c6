"""The sweep on a local Ray cluster gives what the local process backend gives, cell by cell.

ray is in the ``dev`` extra, so a missing ray fails these tests (a broken test install, not a
reason to skip; the rest of the suite still runs); a ray that is installed but cannot start a
cluster on this machine skips them, with Ray's reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

from blitzplan.errors import InvalidInputError
from blitzplan.sim.sweep import Cell, grid, sweep

TIMING = {"wall_s", "events_per_s"}
"""Summary fields that measure this machine's speed, not the simulation."""


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """The ray module, with a small local cluster (2 CPUs, no dashboard) for this module."""
    try:
        import ray
    except ImportError as exc:
        pytest.fail(f"ray is in the dev extra but does not import ({exc}): pip install -e '.[dev]'")
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception as exc:  # Ray's start-up errors have no common base class
        pytest.skip(f"a local Ray cluster cannot start here: {type(exc).__name__}: {exc}")
    try:
        yield ray
    finally:
        ray.shutdown()


def _same(left: dict[str, Any], right: dict[str, Any]) -> bool:
    return left.keys() == right.keys() and all(
        key in TIMING
        or left[key] == right[key]
        or (isinstance(left[key], float) and math.isnan(left[key]) and math.isnan(right[key]))
        for key in left
    )


def test_ray_backend_matches_the_process_backend(local_ray: Any) -> None:
    cells = grid(
        topology="paper-a800-32",
        model="llama-3-8b",
        tp=1,
        systems=["blitzscale", "allcache"],
        traces=[None],
        seeds=[0, 1],
        window_s=(0.0, 30.0),
    )
    on_ray = sweep(cells, backend="ray")
    local = sweep(cells, backend="local", workers=2)
    assert local_ray.is_initialized()  # the sweep used the fixture's cluster and left it running
    assert [(r["system"], r["seed"]) for r in on_ray] == [(c.system, c.seed) for c in cells]
    assert all(r["requests_finished"] > 0 for r in on_ray)
    for cell, a, b in zip(cells, on_ray, local, strict=True):
        assert _same(a, b), (cell, {k: (a[k], b[k]) for k in a if a[k] != b[k]})


def test_a_failing_cell_on_ray_raises_the_library_error(local_ray: Any) -> None:
    good = Cell("paper-a800-32", "llama-3-8b", 1, "allcache", None, 0, (0.0, 5.0))
    bad = Cell("paper-a800-32", "llama-3-8b", 1, "magic", None, 0, (0.0, 5.0))
    with pytest.raises(InvalidInputError, match="magic"):
        sweep([good, bad], backend="ray")
    assert local_ray.is_initialized()
