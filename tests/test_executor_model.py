"""The executor's decoder, seeded weights and boundaries, without starting any process."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import blitzplan  # noqa: E402
from blitzplan import InvalidInputError, ScaleRequest, load_model  # noqa: E402
from blitzplan.cli import main  # noqa: E402
from blitzplan.executor.program.runner import run_program  # noqa: E402
from blitzplan.executor.runtime.failures import Failure, InjectedFault  # noqa: E402
from blitzplan.executor.runtime.pool import Workers  # noqa: E402
from blitzplan.executor.runtime.worker import check_device  # noqa: E402
from blitzplan.executor.smallmodel import llama as m  # noqa: E402
from blitzplan.models.layout import layout  # noqa: E402
from blitzplan.scale.scenarios import scenario_state, small_config  # noqa: E402

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
        layout(dims.spec, 1).rank_buffer(unit, 0, m.hf_arrays(dims, unit, weights))
    )


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
    """Layers 1..k on one copy of the weights, the rest (as the old instance takes a batch
    over: ``forward`` from layer k + 1) on copies read from rank buffers."""
    rope = m.rope_tables(dims, max_positions=len(ids))
    hidden = m.embed(units[0], ids)
    for layer in range(1, k + 1):
        hidden = m.decoder_layer(dims, units[layer], hidden, rope)
    moved = [_through_buffer(dims, u, w) for u, w in enumerate(units)]
    return m.forward(dims, moved, ids, rope, first=k + 1, hidden=hidden.clone())


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


def test_a_model_the_executor_cannot_run_is_refused_before_any_process_starts() -> None:
    spec = load_model({**TINY, "tie_word_embeddings": True})
    state = scenario_state("small", spec)
    request = ScaleRequest(spec, prefill=1, tp=1)
    made = blitzplan.plan(state, request, method="allcache", link_efficiency=1.0)
    with pytest.raises(InvalidInputError, match="uses tie_word_embeddings"):
        run_program(made.to_json())
    assert multiprocessing.active_children() == []


def test_fault_numbers_may_be_numpy_integers() -> None:
    fault = InjectedFault(np.int64(1), np.int32(2))
    assert (fault.rank, fault.layer) == (1, 2) and type(fault.layer) is int
    with pytest.raises(InvalidInputError, match="fault layer must be an integer >= 0, got True"):
        InjectedFault(1, True)


def test_a_failure_quotes_the_first_line_of_an_error() -> None:
    """What a transport's failure quotes of a library's error: its first line, cut, else the
    error's type (an empty message would otherwise leave nothing to quote)."""
    assert Failure.quote(RuntimeError("Connection reset\nstack trace")) == "Connection reset"
    assert Failure.quote(RuntimeError("x" * 500)) == "x" * 200
    assert Failure.quote(RuntimeError("")) == Failure.quote(RuntimeError("\n")) == "RuntimeError"


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


def test_seeded_units_pack_to_the_layouts_rank_buffers() -> None:
    """The executor fills buffers with ``Layout.rank_buffer`` of the seeded weights: TP1's
    buffer is every TP2 rank's bytes; a unit is the same whenever it is made."""
    spec = load_model(TINY)
    dims = m.model_dims(spec)
    for unit in reversed(range(spec.num_units)):
        tensors = m.hf_arrays(dims, unit, m.init_unit(dims, unit))
        whole = layout(spec, 1).rank_buffer(unit, 0, tensors)
        assert whole.nbytes == spec.unit_bytes()[unit]
        assert np.array_equal(_buffer(dims, unit, m.init_unit(dims, unit)).numpy(), whole)
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
