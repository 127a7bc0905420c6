"""The executor's decoder, checkpoints and boundaries, without starting any process."""

from __future__ import annotations

import argparse
import importlib
import itertools
import multiprocessing
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from blitzplan import ClusterState, InvalidInputError, load_model  # noqa: E402
from blitzplan.executor import model as m  # noqa: E402
from blitzplan.executor.calibrate import fit_line, paced_topology  # noqa: E402
from blitzplan.executor.checkpoint import (  # noqa: E402
    CorruptCheckpointError,
    check_identity,
    load_checkpoint,
    load_unit,
    save_checkpoint,
)
from blitzplan.executor.cli import add_validate_command, main  # noqa: E402
from blitzplan.executor.faults import InjectedFault  # noqa: E402
from blitzplan.executor.multicast import run_multicast  # noqa: E402
from blitzplan.executor.probes import smooth  # noqa: E402
from blitzplan.executor.processes import Workers  # noqa: E402
from blitzplan.executor.worker import check_device  # noqa: E402
from blitzplan.multicast import plan_multicast  # noqa: E402
from blitzplan.units import MB  # noqa: E402

TINY = m.small_config(
    num_layers=3,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=64,
)
NO_GPU = not torch.cuda.is_available()


def _units(config: dict[str, object], seed: int = 0) -> tuple[m.Dims, list[m.Weights]]:
    dims = m.model_dims(load_model(config))
    return dims, [m.init_unit(dims, u, seed=seed) for u in range(dims.num_units)]


@settings(max_examples=20)
@given(
    layers=st.integers(1, 3),
    kv_heads=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([4, 8]),
    inter=st.integers(8, 40),
    vocab=st.integers(5, 50),
)
def test_units_flatten_to_exactly_the_spec_bytes(
    layers: int, kv_heads: int, head_dim: int, inter: int, vocab: int
) -> None:
    """Property: every unit flattens to spec.unit_bytes()[u] bytes and unflattens to itself."""
    config = m.small_config(
        num_layers=layers,
        hidden_size=4 * head_dim,
        intermediate_size=inter,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
    )
    spec = load_model(config)
    dims, units = _units(config)
    for unit, weights in enumerate(units):
        flat = m.flatten_unit(dims, unit, weights)
        assert flat.numel() == spec.unit_bytes()[unit]
        back = m.unflatten_unit(dims, unit, flat)
        assert all(torch.equal(back[k], weights[k]) for k in weights)


def _split_forward(dims: m.Dims, units: list[m.Weights], ids: torch.Tensor, k: int) -> torch.Tensor:
    """Layers 1..k on one copy of the weights, the rest on copies made from flattened bytes."""
    rope = m.rope_tables(dims, max_positions=len(ids))
    hidden = m.embed(units[0], ids)
    for layer in range(1, k + 1):
        hidden = m.decoder_layer(dims, units[layer], hidden, rope)
    moved = [m.unflatten_unit(dims, u, m.flatten_unit(dims, u, w)) for u, w in enumerate(units)]
    for layer in range(k + 1, dims.layers + 1):
        hidden = m.decoder_layer(dims, moved[layer], hidden.clone(), rope)
    return m.final_logits(dims, moved[-1], hidden)


def test_splitting_the_layers_anywhere_gives_the_monolithic_logits() -> None:
    """Cooperative execution's premise: any split k over two copies is bit-identical."""
    dims, units = _units(TINY)
    ids = torch.tensor([3, 17, 42, 8, 8, 63, 0])
    whole = m.forward(dims, units, ids, m.rope_tables(dims, max_positions=len(ids)))
    assert whole.shape == (dims.vocab,)
    for k in range(dims.layers + 1):
        assert torch.equal(_split_forward(dims, units, ids, k), whole)


def test_attention_is_causal_and_position_aware() -> None:
    """A later token never changes an earlier position; the order of tokens matters."""
    dims, units = _units(TINY)
    rope = m.rope_tables(dims, max_positions=8)
    ids = torch.tensor([5, 9, 1, 30, 2])
    hidden = m.decoder_layer(dims, units[1], m.embed(units[0], ids), rope)
    changed = m.decoder_layer(
        dims, units[1], m.embed(units[0], torch.tensor([5, 9, 1, 30, 7])), rope
    )
    assert torch.equal(hidden[:4], changed[:4]) and not torch.equal(hidden[4], changed[4])
    swapped = m.forward(dims, units, torch.tensor([9, 5, 1, 30, 2]), rope)
    assert not torch.allclose(swapped, m.forward(dims, units, ids, rope))


def test_decode_step_matches_the_last_position_of_prefill() -> None:
    """A decode step over cached keys equals prefill's last row (the calibration's decode)."""
    dims, units = _units(TINY)
    rope = m.rope_tables(dims, max_positions=8)
    x = torch.randn(6, dims.hidden, generator=torch.Generator().manual_seed(1))
    full = m.decoder_layer(dims, units[1], x, rope)
    w = units[1]
    normed = m._rms_norm(x[:5], w["input_layernorm.weight"], dims.rms_norm_eps)
    k = torch.nn.functional.linear(normed, w["self_attn.k_proj.weight"])
    v = torch.nn.functional.linear(normed, w["self_attn.v_proj.weight"])
    k = m._rotate(
        k.view(5, dims.kv_heads, dims.head_dim).transpose(0, 1), rope.cos[:5], rope.sin[:5]
    )
    v = v.view(5, dims.kv_heads, dims.head_dim).transpose(0, 1)
    step = m.decode_layer(dims, w, x[5:], k.unsqueeze(0), v.unsqueeze(0), rope)
    torch.testing.assert_close(step[0], full[5], rtol=1e-5, atol=1e-5)


def test_unsupported_models_are_refused_by_name() -> None:
    with pytest.raises(InvalidInputError, match="qkv_bias"):
        m.model_dims(load_model("qwen2.5-7b"))
    with pytest.raises(InvalidInputError, match="torch_dtype must be one of"):
        m.model_dims(load_model({**TINY, "torch_dtype": "int8"}))


def test_checkpoint_round_trip_and_identity(tmp_path: Path) -> None:
    spec = load_model(TINY)
    checkpoint = save_checkpoint(spec, tmp_path / "a", seed=3)
    assert load_checkpoint(tmp_path / "a") == checkpoint
    assert checkpoint.identity == spec.identity and checkpoint.num_units == spec.num_units
    dims = m.model_dims(spec)
    for unit in range(spec.num_units):
        assert torch.equal(
            m.flatten_unit(dims, unit, load_unit(checkpoint, unit)),
            m.flatten_unit(dims, unit, m.init_unit(dims, unit, seed=3)),
        )
    other = load_model(TINY, revision="v2")
    with pytest.raises(InvalidInputError, match=r"holds model .*@main.*plan's model is .*@v2"):
        check_identity(checkpoint, other.identity)


def test_a_unit_of_another_version_or_corrupted_is_refused(tmp_path: Path) -> None:
    first = save_checkpoint(load_model(TINY), tmp_path / "a")
    second = save_checkpoint(load_model(TINY, revision="v2"), tmp_path / "b")
    name = first.files[1]
    (tmp_path / "a" / name).write_bytes((tmp_path / "b" / name).read_bytes())
    with pytest.raises(InvalidInputError, match="belongs to model .*@v2"):
        load_unit(first, 1)
    data = bytearray((tmp_path / "b" / name).read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / "b" / name).write_bytes(bytes(data))
    with pytest.raises(InvalidInputError, match="hashes to .* the manifest says"):
        load_unit(second, 1)


def test_weights_of_another_model_are_refused_before_any_process_starts(tmp_path: Path) -> None:
    spec, other = load_model(TINY), load_model(TINY, revision="v2")
    state = ClusterState(paced_topology(3, bytes_per_s=10 * MB, latency_s=0.0), models=[spec])
    plan = plan_multicast(state, spec, targets=[["h0/gpu1"], ["h0/gpu2"]])
    checkpoint = save_checkpoint(other, tmp_path / "w")
    started = time.monotonic()
    with pytest.raises(InvalidInputError, match="refusing to mix weights"):
        run_multicast(plan, checkpoint)
    assert time.monotonic() - started < 1.0
    assert multiprocessing.active_children() == []


def _corrupt(checkpoint_dir: Path, name: str) -> None:
    """Flip the last byte of a unit file (its tensor data: the header still parses)."""
    data = bytearray((checkpoint_dir / name).read_bytes())
    data[-1] ^= 0xFF
    (checkpoint_dir / name).write_bytes(bytes(data))


@pytest.mark.parametrize("unit", [0, 2, 4])  # the embedding, a layer, the head (L=3)
def test_a_corrupted_unit_is_refused_naming_it_before_any_process_starts(
    tmp_path: Path, unit: int
) -> None:
    spec = load_model(TINY)
    state = ClusterState(paced_topology(3, bytes_per_s=10 * MB, latency_s=0.0), models=[spec])
    plan = plan_multicast(state, spec, targets=[["h0/gpu1"], ["h0/gpu2"]])
    checkpoint = save_checkpoint(spec, tmp_path / "w")
    _corrupt(tmp_path / "w", checkpoint.files[unit])
    with pytest.raises(CorruptCheckpointError, match=rf"unit {unit} in .* hashes to") as info:
        run_multicast(plan, checkpoint)
    assert info.value.layer == info.value.unit == unit
    assert multiprocessing.active_children() == []
    (tmp_path / "w" / checkpoint.files[unit]).write_text("not safetensors")
    with pytest.raises(CorruptCheckpointError, match=rf"unit {unit} file .* does not read"):
        check_identity(checkpoint, spec.identity)
    (tmp_path / "w" / checkpoint.files[unit]).unlink()
    with pytest.raises(CorruptCheckpointError, match=rf"unit {unit} file .* is missing"):
        check_identity(checkpoint, spec.identity)


def test_fault_numbers_may_be_numpy_integers() -> None:
    fault = InjectedFault(np.int64(1), np.int32(2), kind="stall")
    assert (fault.rank, fault.layer) == (1, 2) and type(fault.layer) is int
    with pytest.raises(InvalidInputError, match="fault layer must be an integer >= 0, got True"):
        InjectedFault(1, True)


def test_bad_options_name_the_argument() -> None:
    with pytest.raises(InvalidInputError, match="device must be one of cpu, cuda, got 'tpu'"):
        check_device("tpu", 2)
    with pytest.raises(InvalidInputError, match="fault kind must be one of die, stall"):
        InjectedFault(1, 2, kind="explode")
    with pytest.raises(InvalidInputError, match="timeout_s must be a number > 0"):
        Workers(["a", "b"], timeout_s=0)


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InvalidInputError, match=r"device='cuda' needs a GPU.*use device='cpu'"):
        check_device("cuda", 3)
    assert main(["validate", "--device", "cuda", "--png", ""]) == 2
    assert "device='cuda' needs a GPU" in capsys.readouterr().err
    assert multiprocessing.active_children() == []


def test_validate_help_ends_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="blitzplan")
    add_validate_command(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["validate", "--help"])
    lines = capsys.readouterr().out.rstrip().splitlines()
    assert lines[-2:] == ["example:", "  blitzplan validate --json"]


def test_calibration_fits() -> None:
    """Property of the fits: a line through exact points is recovered, smoothing is monotone."""
    intercept, slope = fit_line([1.0, 2.0, 4.0], [3.0, 5.0, 9.0])
    assert intercept == pytest.approx(1.0) and slope == pytest.approx(2.0)
    fitted = smooth([64, 96, 128, 160], [0.004, 0.002, 0.007, 0.006])
    assert all(a <= b for a, b in itertools.pairwise(fitted))
    with pytest.raises(InvalidInputError, match="two distinct x values"):
        fit_line([1.0, 1.0], [2.0, 3.0])


def test_validate_exits_nonzero_when_outputs_differ(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The exit status follows ``result.ok`` (logits or bits differ: EXIT_MISMATCH)."""
    from blitzplan.executor.cli import EXIT_MISMATCH

    module = importlib.import_module("blitzplan.executor.validate")

    class Differs:
        ok = False

        def to_json(self) -> dict[str, object]:
            return {"max_abs_logit_diff": 0.5, "layers_bit_exact": True}

    monkeypatch.setattr(module, "validate", lambda *args, **kwargs: Differs())
    assert main(["validate", "--json", "--png", ""]) == EXIT_MISMATCH
    assert '"max_abs_logit_diff": 0.5' in capsys.readouterr().out


def test_the_live_checker_catches_broken_runs() -> None:
    """Certificate of the certificate: a valid run passes; each broken rule is named."""
    from blitzplan.executor.live import LiveRun, live_violations
    from blitzplan.live.schedule import NewOp, OldOp

    def run(new_ops: list[NewOp], old_ops: list[OldOp], completion: list[float]) -> LiveRun:
        return LiveRun(
            policy="zigzag",
            release_s=(0.0, 0.0),
            split=(1, 0),
            new_ops=tuple(new_ops),
            old_ops=tuple(old_ops),
            completion_s=tuple(completion),
            unit_arrival_s=(0.1, 0.2, 0.3, 0.4),  # embedding, layers 1-2, head
            logit_diff=(0.0, 0.0),
            transfer=None,  # type: ignore[arg-type]
        )

    good = run(
        [NewOp(0, 1, 0.2, 0.25)], [OldOp(1, 1, 0.0, 0.2), OldOp(0, 2, 0.25, 0.3)], [0.3, 0.2]
    )
    assert live_violations(good) == ()
    early = run(
        [NewOp(0, 1, 0.15, 0.25)], [OldOp(1, 1, 0.0, 0.2), OldOp(0, 2, 0.25, 0.3)], [0.3, 0.2]
    )
    assert any("layer 1 starts before it could" in v for v in live_violations(early))
    overlap = run(
        [NewOp(0, 1, 0.2, 0.25)], [OldOp(1, 1, 0.0, 0.3), OldOp(0, 2, 0.25, 0.3)], [0.3, 0.3]
    )
    assert any("runs batches 1 and 0 at once" in v for v in live_violations(overlap))
