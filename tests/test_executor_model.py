"""The executor's decoder, checkpoints and boundaries, without starting any process."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from blitzplan import InvalidInputError, load_model  # noqa: E402
from blitzplan.cli import main  # noqa: E402
from blitzplan.executor.program.runner import run_program  # noqa: E402
from blitzplan.executor.runtime.failures import InjectedFault  # noqa: E402
from blitzplan.executor.runtime.pool import Workers  # noqa: E402
from blitzplan.executor.runtime.worker import check_device  # noqa: E402
from blitzplan.executor.smallmodel import llama as m  # noqa: E402
from blitzplan.executor.smallmodel.checkpoint import (  # noqa: E402
    WEIGHTS,
    Checkpoint,
    CorruptCheckpointError,
    load_unit,
    open_checkpoint,
    save_checkpoint,
)
from blitzplan.models.layout import layout  # noqa: E402
from blitzplan.scale.scenarios import scenario_plan, small_config  # noqa: E402

TINY = small_config(
    num_layers=3,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=64,
)
NO_GPU = not torch.cuda.is_available()


def _buffer(dims: m.Dims, unit: int, weights: m.Weights) -> torch.Tensor:
    """The unit packed into its TP1 rank buffer (what the executor moves)."""
    return torch.from_numpy(
        layout(dims.spec, 1).rank_buffer(unit, 0, m.as_integers(_hf_named(dims, unit, weights)))
    )


def _hf_named(dims: m.Dims, unit: int, weights: m.Weights) -> m.Weights:
    return {t.name: weights[m.short_name(t.name)] for t in layout(dims.spec, 1).units[unit].tensors}


def _through_buffer(dims: m.Dims, unit: int, weights: m.Weights) -> m.Weights:
    """The unit packed into its TP1 rank buffer and read back."""
    return m.unit_from_buffer(dims, unit, _buffer(dims, unit, weights), torch.device("cpu"))


def _units(config: dict[str, object], seed: int = 0) -> tuple[m.Dims, list[m.Weights]]:
    dims = m.model_dims(load_model(config))
    return dims, [m.init_unit(dims, u, seed=seed) for u in range(dims.spec.num_units)]


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
    """Property: every unit packs to spec.unit_bytes()[u] bytes, and its TP1 rank buffer (as
    the executor moves it) reads back to itself."""
    config = small_config(
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
        assert _buffer(dims, unit, weights).numel() == spec.unit_bytes()[unit]
        back = _through_buffer(dims, unit, weights)
        assert all(torch.equal(back[k], weights[k]) for k in weights)


def _split_forward(dims: m.Dims, units: list[m.Weights], ids: torch.Tensor, k: int) -> torch.Tensor:
    """Layers 1..k on one copy of the weights, the rest on copies read from rank buffers."""
    rope = m.rope_tables(dims, max_positions=len(ids))
    hidden = m.embed(units[0], ids)
    for layer in range(1, k + 1):
        hidden = m.decoder_layer(dims, units[layer], hidden, rope)
    moved = [_through_buffer(dims, u, w) for u, w in enumerate(units)]
    for layer in range(k + 1, dims.layers + 1):
        hidden = m.decoder_layer(dims, moved[layer], hidden.clone(), rope)
    return m.final_logits(dims, moved[-1], hidden)


def test_splitting_the_layers_anywhere_gives_the_monolithic_logits() -> None:
    """Cooperative execution's premise: any split k over two copies is bit-identical."""
    dims, units = _units(TINY)
    ids = torch.tensor([3, 17, 42, 8, 8, 63, 0])
    whole = m.forward(dims, units, ids, m.rope_tables(dims, max_positions=len(ids)))
    assert whole.shape == (dims.spec.vocab_size,)
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


def test_unsupported_models_are_refused_by_name() -> None:
    with pytest.raises(InvalidInputError, match="qkv_bias"):
        m.model_dims(load_model("qwen2.5-7b"))
    with pytest.raises(InvalidInputError, match="torch_dtype must be one of"):
        m.model_dims(load_model({**TINY, "torch_dtype": "int8"}))


def test_checkpoint_round_trip_and_identity(tmp_path: Path) -> None:
    """A checkpoint is a Hugging Face directory: config.json and model.safetensors under the
    model's tensor names; it reads back to the seeded weights; another config is refused."""
    spec = load_model(TINY)
    checkpoint = save_checkpoint(spec, tmp_path / "a", seed=3)
    assert open_checkpoint(tmp_path / "a", spec) == checkpoint
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["config.json", WEIGHTS]
    assert load_model(tmp_path / "a" / "config.json").config == spec.config
    dims = m.model_dims(spec)
    for unit in range(spec.num_units):
        tensors = load_unit(checkpoint, unit)
        assert {m.short_name(k) for k in tensors} == set(m.init_unit(dims, unit, seed=3))
        assert torch.equal(
            _buffer(dims, unit, {m.short_name(k): t for k, t in tensors.items()}),
            _buffer(dims, unit, m.init_unit(dims, unit, seed=3)),
        )
    other = load_model({**TINY, "rope_theta": 500_000.0})
    with pytest.raises(InvalidInputError, match=r"holds model .*, but the plan's model is .*mix"):
        open_checkpoint(tmp_path / "a", other)
    hashed = load_model(tmp_path / "a")  # a model named by its weights' hash
    assert hashed.identity.hash_kind == "weights" and open_checkpoint(tmp_path / "a", hashed)
    save_checkpoint(spec, tmp_path / "b", seed=4)
    with pytest.raises(InvalidInputError, match="refusing to mix weights"):
        open_checkpoint(tmp_path / "b", hashed)


def test_weights_of_another_model_are_refused_before_any_process_starts(tmp_path: Path) -> None:
    _, made = scenario_plan("small")
    other = load_model({**made.spec.config, "rms_norm_eps": 1e-6})
    checkpoint = save_checkpoint(other, tmp_path / "w")
    started = time.monotonic()
    with pytest.raises(InvalidInputError, match="refusing to mix weights"):
        run_program(made.to_json(), checkpoint)
    assert time.monotonic() - started < 5.0
    assert multiprocessing.active_children() == []


def _rewrite(checkpoint: Checkpoint, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    """The checkpoint's weights file written again with ``edit`` applied to its tensors."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(checkpoint.directory / WEIGHTS))
    edit(tensors)
    save_file(tensors, str(checkpoint.directory / WEIGHTS))


@pytest.mark.parametrize("unit", [0, 2, 5])  # the embedding, a layer, the head (L=4)
def test_a_bad_weights_file_is_refused_naming_the_unit_before_any_process_starts(
    tmp_path: Path, unit: int
) -> None:
    _, made = scenario_plan("small")
    spec = made.spec
    checkpoint = save_checkpoint(spec, tmp_path / "w")
    name = layout(spec, 1).units[unit].tensors[-1].name
    _rewrite(checkpoint, lambda t: t.update({name: t[name][:-1].clone()}))
    with pytest.raises(CorruptCheckpointError, match=rf"unit {unit}: tensor .* of shape") as info:
        run_program(made.to_json(), checkpoint)
    assert info.value.layer == info.value.unit == unit
    assert multiprocessing.active_children() == []
    _rewrite(checkpoint, lambda t: t.update({name: t[name].double()}))
    with pytest.raises(CorruptCheckpointError, match=rf"unit {unit}: tensor .* is F64 of shape"):
        open_checkpoint(checkpoint.directory, spec)
    _rewrite(checkpoint, lambda t: t.pop(name))
    with pytest.raises(CorruptCheckpointError, match=rf"unit {unit}: .* does not hold its tensors"):
        open_checkpoint(checkpoint.directory, spec)
    (checkpoint.directory / WEIGHTS).write_text("not safetensors")
    with pytest.raises(CorruptCheckpointError, match=r"unit 0: .* does not hold its tensors"):
        open_checkpoint(checkpoint.directory, spec)


def test_fault_numbers_may_be_numpy_integers() -> None:
    fault = InjectedFault(np.int64(1), np.int32(2))
    assert (fault.rank, fault.layer) == (1, 2) and type(fault.layer) is int
    with pytest.raises(InvalidInputError, match="fault layer must be an integer >= 0, got True"):
        InjectedFault(1, True)


def test_bad_options_name_the_argument() -> None:
    with pytest.raises(InvalidInputError, match="device must be one of cpu, cuda, got 'tpu'"):
        check_device("tpu", 2)
    with pytest.raises(InvalidInputError, match="timeout_s must be finite and > 0"):
        Workers(["a", "b"], timeout_s=0)


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InvalidInputError, match=r"device='cuda' needs a GPU.*use device='cpu'"):
        check_device("cuda", 3)
    assert main(["validate", "--program", "small", "--device", "cuda"]) == 2
    assert "device='cuda' needs a GPU" in capsys.readouterr().err
    assert multiprocessing.active_children() == []


def test_validate_help_ends_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    lines = capsys.readouterr().out.rstrip().splitlines()
    assert lines[-2:] == ["example:", "  blitzplan validate --program small --transport nixl"]


def test_checkpoint_tensors_pack_to_the_layouts_rank_buffers(tmp_path: Path) -> None:
    """The executor fills buffers with ``Layout.rank_buffer`` of the checkpoint's tensors: TP1's
    buffer is every TP2 rank's bytes, and every byte comes from the checkpoint."""
    spec = load_model(TINY)
    checkpoint = save_checkpoint(spec, tmp_path, seed=2)
    for unit in range(spec.num_units):
        tensors = m.as_integers(load_unit(checkpoint, unit))
        whole = layout(spec, 1).rank_buffer(unit, 0, tensors)
        assert whole.nbytes == spec.unit_bytes()[unit]
        halves = [layout(spec, 2).rank_buffer(unit, r, tensors) for r in (0, 1)]
        assert sum(h.nbytes for h in halves) >= whole.nbytes  # replicated norms count twice


def test_the_live_checker_catches_broken_runs() -> None:
    """Certificate of the certificate: a valid run passes; each broken rule is named."""
    from blitzplan.executor.serving.serve import LiveRun
    from blitzplan.live.schedule import NewOp, OldOp
    from blitzplan.live.schedule_checks import measured_violations

    def run(new_ops: list[NewOp], old_ops: list[OldOp], completion: list[float]) -> LiveRun:
        return LiveRun(
            policy="zigzag",
            release_s=(0.0, 0.0),
            predicted_s=(0.3, 0.2),
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
    assert measured_violations(good) == ()
    early = run(
        [NewOp(0, 1, 0.15, 0.25)], [OldOp(1, 1, 0.0, 0.2), OldOp(0, 2, 0.25, 0.3)], [0.3, 0.2]
    )
    assert any("layer 1 starts before it could" in v for v in measured_violations(early))
    overlap = run(
        [NewOp(0, 1, 0.2, 0.25)], [OldOp(1, 1, 0.0, 0.3), OldOp(0, 2, 0.25, 0.3)], [0.3, 0.3]
    )
    assert any("runs batches 1 and 0 at once" in v for v in measured_violations(overlap))
