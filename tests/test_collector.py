"""The collector context managers restore the interpreter's setting, also when the body raises."""

import gc

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
