"""The collector context managers restore the interpreter's setting, also when the body raises."""

import gc
import importlib

import pytest

from blitzplan._collector import RELAXED_THRESHOLDS, collector_paused, collector_relaxed


def test_relaxed_raises_the_young_threshold_and_restores_it_after_an_error() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), collector_relaxed():
        relaxed = gc.get_threshold()
        assert relaxed == tuple(max(b, r) for b, r in zip(before, RELAXED_THRESHOLDS, strict=True))
        assert relaxed != before
        raise RuntimeError("boom")
    assert gc.get_threshold() == before


def test_paused_disables_and_reenables_only_if_it_was_enabled() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_plan_runs_with_the_collector_relaxed_and_restores_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from blitzplan import ClusterState, load_topology
    from blitzplan.scale import ScaleRequest, plan

    plan_module = importlib.import_module("blitzplan.scale.plan")

    seen = []
    inner = plan_module.role_changes

    def watched(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(gc.get_threshold())
        return inner(*args, **kwargs)

    monkeypatch.setattr(plan_module, "role_changes", watched)
    state = ClusterState(load_topology("dgx-h100-64"), models=["llama-3-8b"])
    state.add_instance("llama-3-8b", gpus=["h0/gpu0"], role="decode")
    before = gc.get_threshold()
    plan(state, ScaleRequest("llama-3-8b", prefill=2, tp=1))
    assert seen == [tuple(max(b, r) for b, r in zip(before, RELAXED_THRESHOLDS, strict=True))]
    assert gc.get_threshold() == before
