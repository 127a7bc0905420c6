"""The per-rank transfer-buffer layout: sizes, names, packing, slice-major stripes, resharding."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction
from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blitzplan import InvalidInputError, Layout, layout, list_models, load_model
from blitzplan.models import ModelSpec
from tests import model_configs as mc

TPS = (1, 2, 4, 8)
PAIRS = [(1, 2), (2, 1), (2, 4), (4, 2), (1, 4), (4, 1)]


def _config(**overrides: object) -> dict[str, object]:
    """A small Llama config.json in the style of the executor's ``small_config``."""
    return {
        "model_type": "llama",
        "_name_or_path": "layout-test-llama",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        **overrides,
    }


MODELS: dict[str, ModelSpec] = {
    "small": load_model(_config()),
    "padded": load_model(_config(vocab_size=99, torch_dtype="float16")),
    "qwen2": load_model(_config(model_type="qwen2", tie_word_embeddings=True)),
    "vocab10": load_model(_config(vocab_size=10)),
    "mixtral": load_model(
        _config(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2)
    ),
}
SIZED_CONFIGS = {
    "qwen2-57b-a14b": mc.QWEN2_57B_A14B,
    "qwen1.5-moe-a2.7b": mc.QWEN1_5_MOE_A2_7B,
    "qwen3-8b": mc.QWEN3_8B,
    "deepseek-v2-lite": mc.DEEPSEEK_V2_LITE,
    "gemma-2-9b": mc.GEMMA_2_9B,
    "phi-3.5-moe": mc.PHI_3_5_MOE,
}


def _valid(spec: ModelSpec, tp: int) -> bool:
    try:
        spec.check_tp(tp)
    except InvalidInputError:
        return False
    return True


@cache
def _layout(key: str, tp: int) -> Layout:
    return layout(MODELS[key], tp)


@cache
def _full(key: str) -> dict[str, np.ndarray]:
    """Seeded full HF tensors of every unit of a test model, in its dtype."""
    rng = np.random.default_rng(7)
    dtype = np.float16 if MODELS[key].dtype_bytes == 2 else np.float32
    return {
        t.name: rng.standard_normal(t.shape).astype(dtype)
        for unit in _layout(key, 1).units
        for t in unit.tensors
    }


@cache
def _buffer(key: str, tp: int, unit: int, rank: int) -> np.ndarray:
    return _layout(key, tp).rank_buffer(unit, rank, _full(key))


# --- an independent statement of the split rule ----------------------------------------------


def _expected_shard(spec: ModelSpec, name: str, full: np.ndarray, rank: int, tp: int) -> np.ndarray:
    """Rank ``rank``'s shard in HF orientation, by the Megatron rule written out by name."""
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        rows = math.ceil(spec.vocab_size / tp)
        shard = np.zeros((rows, full.shape[1]), dtype=full.dtype)
        piece = full[rank * rows : (rank + 1) * rows]
        shard[: len(piece)] = piece
        return shard
    if "norm" in name or name.endswith("block_sparse_moe.gate.weight"):
        return full
    if any(k in name for k in ("k_proj", "v_proj")) and tp > spec.num_kv_heads:
        head = rank * spec.num_kv_heads // tp
        return full[head * spec.head_dim : (head + 1) * spec.head_dim]
    if any(k in name for k in ("o_proj", "down_proj", ".w2.")):
        width = full.shape[1] // tp
        return full[:, rank * width : (rank + 1) * width]
    rows = full.shape[0] // tp  # column-parallel weight or bias
    return full[rank * rows : (rank + 1) * rows]


def _wire(name: str, shard: np.ndarray) -> np.ndarray:
    """A shard as wire rows of bytes: row-parallel transposed, replicated one element a row."""
    if any(k in name for k in ("o_proj", "down_proj", ".w2.")):
        shard = shard.T
    elif "norm" in name or name.endswith("block_sparse_moe.gate.weight"):
        shard = shard.reshape(-1, 1)
    shard = np.ascontiguousarray(shard)
    return shard.reshape(shard.shape[0], -1).view(np.uint8)


# --- sizes and names --------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*list_models(), *SIZED_CONFIGS])
def test_unit_bytes_equal_the_spec_shard(name: str) -> None:
    spec = load_model(SIZED_CONFIGS[name]) if name in SIZED_CONFIGS else load_model(name)
    tps = [tp for tp in TPS if _valid(spec, tp)]
    assert 1 in tps
    for tp in tps:
        lay = layout(spec, tp)
        sums = tuple(sum(t.nbytes for t in unit.tensors) for unit in lay.units)
        assert sums == spec.shard(tp).unit_bytes == lay.unit_bytes
        rows = [t.rows for unit in lay.units for t in unit.tensors]
        assert all(r % lay.grid == 0 for r in rows) and 4096 % lay.grid == 0
        assert math.gcd(4096 // lay.grid, *(r // lay.grid for r in rows)) == 1  # the largest


def test_hugging_face_names_splits_and_orientation() -> None:
    qwen = {t.name: t for u in layout(MODELS["qwen2"], 2).units for t in u.tensors}
    bias = qwen["model.layers.1.self_attn.q_proj.bias"]
    assert (bias.split, bias.rank_shape, bias.rank_starts) == ("column", (16,), (0, 16))
    assert "lm_head.weight" not in qwen  # tied to the embedding
    o_proj = qwen["model.layers.0.self_attn.o_proj.weight"]
    assert (o_proj.split, o_proj.transposed, o_proj.rank_shape) == ("row", True, (16, 32))
    moe = {t.name: t for u in layout(load_model(mc.QWEN1_5_MOE_A2_7B), 4).units for t in u.tensors}
    gate = moe["model.layers.0.mlp.shared_expert_gate.weight"]
    assert (gate.split, gate.shape, gate.rows, gate.row_bytes) == ("replicated", (1, 2048), 2048, 2)
    down = moe["model.layers.23.mlp.experts.59.down_proj.weight"]
    assert (down.split, down.rank_shape) == ("row", (1408 // 4, 2048))
    assert "model.layers.0.mlp.shared_expert.up_proj.weight" in moe
    mixtral = [t.name for t in layout("mixtral-8x7b", 8).units[1].tensors]
    assert mixtral[:7] == [
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.block_sparse_moe.gate.weight",
    ]
    assert mixtral[7:10] == [f"model.layers.0.block_sparse_moe.experts.0.{w}.weight" for w in (
        "w1", "w3", "w2")]  # fmt: skip
    assert len(mixtral) == 7 + 8 * 3


def test_kv_heads_replicate_beyond_their_count() -> None:
    k_proj = next(t for t in _layout("small", 4).units[1].tensors if "k_proj" in t.name)
    assert k_proj.rank_starts == (0, 0, 8, 8)  # rank r holds KV head r * 2 // 4 (head_dim 8)
    assert k_proj.rows == 8


# --- packing ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(MODELS))
def test_rank_buffers_unpack_to_the_megatron_shards(key: str) -> None:
    spec, full = MODELS[key], _full(key)
    for tp in (tp for tp in (1, 2, 4) if _valid(spec, tp)):
        lay = _layout(key, tp)
        for unit in range(spec.num_units):
            for rank in range(tp):
                buffer = _buffer(key, tp, unit, rank)
                assert buffer.dtype == np.uint8 and len(buffer) == spec.shard(tp).unit_bytes[unit]
                shards = lay.unpack(unit, rank, buffer, dtype=next(iter(full.values())).dtype)
                assert list(shards) == [t.name for t in lay.units[unit].tensors]
                for name, shard in shards.items():
                    want = _expected_shard(spec, name, full[name], rank, tp)
                    assert shard.shape == want.shape and shard.tobytes() == want.tobytes(), name


def test_unpack_defaults_to_unsigned_integers_of_the_element_width() -> None:
    shards = _layout("padded", 2).unpack(0, 1, _buffer("padded", 2, 0, 1))
    embedding = shards["model.embed_tokens.weight"]
    assert embedding.dtype == np.uint16 and embedding.shape == (50, 32)
    assert not embedding[49].any()  # vocabulary 99 over 2 ranks: the last row is padding
    assert embedding[:49].tobytes() == _full("padded")["model.embed_tokens.weight"][50:].tobytes()


@pytest.mark.parametrize(("key", "tp"), [("small", 1), ("small", 2), ("padded", 2), ("mixtral", 2)])
def test_on_grid_stripes_are_the_same_rows_of_every_tensor(key: str, tp: int) -> None:
    spec, lay, full = MODELS[key], _layout(key, tp), _full(key)
    for unit in range(spec.num_units):
        rank = tp - 1
        wires = [_wire(n, _expected_shard(spec, n, full[n], rank, tp)) for n in _names(lay, unit)]
        buffer = _buffer(key, tp, unit, rank)
        for lo, hi in [(0, 1), (0, 1 / lay.grid), (lay.grid - 1, lay.grid), (1, lay.grid)]:
            low, high = (Fraction(lo, lay.grid), Fraction(hi, lay.grid)) if hi > 1 else (lo, hi)
            offset, length = lay.stripe_bytes(unit, low, high)
            want = b"".join(
                w[k * len(w) // lay.grid : (k + 1) * len(w) // lay.grid].tobytes()
                for k in range(round(low * lay.grid), round(high * lay.grid))
                for w in wires
            )
            assert buffer[offset : offset + length].tobytes() == want


def _names(lay: Layout, unit: int) -> list[str]:
    return [t.name for t in lay.units[unit].tensors]


def test_adjacent_stripes_share_their_boundary_byte() -> None:
    lay = _layout("padded", 1)
    nbytes = lay.unit_bytes[1]
    cuts = [0.0, 0.1, 1 / 3, 0.5, 0.77, 1.0]
    stripes = [lay.stripe_bytes(1, a, b) for a, b in itertools.pairwise(cuts)]
    assert [o for o, _ in stripes] == [round(c * nbytes) for c in cuts[:-1]]
    assert all(o + n == o2 for (o, n), (o2, _) in itertools.pairwise(stripes))
    assert sum(n for _, n in stripes) == nbytes


# --- resharding -------------------------------------------------------------------------------


@st.composite
def _reshard_cases(draw: st.DrawFn) -> tuple[str, int, int, int, int, float, float]:
    key = draw(st.sampled_from(["small", "padded", "vocab10", "mixtral"]))
    tp, source_tp = draw(st.sampled_from(PAIRS))
    unit = draw(st.integers(0, MODELS[key].num_units - 1))
    rank = draw(st.integers(0, tp - 1))
    grid = _layout(key, tp).grid
    on_grid = st.integers(0, grid).map(lambda k: k / grid)
    lo, hi = sorted(draw(st.lists(st.floats(0, 1) | on_grid, min_size=2, max_size=2)))
    return key, tp, source_tp, unit, rank, lo, hi


@given(_reshard_cases())
def test_property_reshard_copies_rebuild_the_stripe(
    case: tuple[str, int, int, int, int, float, float],
) -> None:
    """Property: for any stripe (on or off the grid) of a target rank, the copies reshard()
    returns from every source rank (each what it holds) rebuild the stripe bit-exactly into a
    zeroed buffer; every copy lies inside both buffers and inside the stripe, and no two copies
    of one source rank overlap."""
    key, tp, source_tp, unit, rank, lo, hi = case
    target, source = _layout(key, tp), _layout(key, source_tp)
    offset, length = target.stripe_bytes(unit, lo, hi)
    built = np.zeros(target.unit_bytes[unit], dtype=np.uint8)
    for source_rank in range(source_tp):
        held = _buffer(key, source_tp, unit, source_rank)
        copies = target.reshard(unit, source, source_rank, rank, lo, hi, partial=True)
        assert all(a[1] + a[2] <= b[1] for a, b in itertools.pairwise(copies))
        for src, dest, size in copies:
            assert size > 0 and src + size <= len(held)
            assert offset <= dest and dest + size <= offset + length
            built[dest : dest + size] = held[src : src + size]
    want = _buffer(key, tp, unit, rank)[offset : offset + length]
    assert built[offset : offset + length].tobytes() == want.tobytes()


@pytest.mark.parametrize("key", ["small", "padded", "vocab10", "mixtral"])
@pytest.mark.parametrize(("tp", "source_tp"), [*PAIRS, (2, 2), (1, 1)])
def test_exact_for_says_whether_single_ranks_serve_grid_stripes(
    key: str, tp: int, source_tp: int
) -> None:
    target, source = _layout(key, tp), _layout(key, source_tp)
    m = max(1, source_tp // tp)
    served = target.grid % m == 0
    for unit in range(MODELS[key].num_units):
        for rank in range(tp):
            for j in range(m):
                server = rank * m + j if source_tp > tp else rank * source_tp // tp
                lo, hi = Fraction(j, m), Fraction(j + 1, m)
                try:
                    copies = target.reshard(unit, source, server, rank, lo, hi)
                except InvalidInputError:
                    served = False
                    continue
                _check_copies(key, (tp, source_tp), (unit, rank, server), (lo, hi), copies)
    assert target.exact_for(source_tp) is served
    if key == "small" and source_tp > tp:
        assert served  # vocabulary 128 and grid 2**k: every pair here is exact
    if key == "vocab10" and (tp, source_tp) == (4, 2):
        assert not served  # rank 1 holds vocabulary rows 3..5, split over source ranks 0 and 1


def _check_copies(
    key: str, tps: tuple[int, int], where: tuple[int, int, int], span: tuple[Any, Any], copies: Any
) -> None:
    (tp, source_tp), (unit, rank, server) = tps, where
    offset, length = _layout(key, tp).stripe_bytes(unit, *span)
    built = np.zeros(length, dtype=np.uint8)
    held = _buffer(key, source_tp, unit, server)
    for src, dest, size in copies:
        built[dest - offset : dest - offset + size] = held[src : src + size]
    assert built.tobytes() == _buffer(key, tp, unit, rank)[offset : offset + length].tobytes()


def test_exact_for_on_presets() -> None:
    lay = layout("llama-3-70b", 1)
    assert lay.grid == 256 and all(lay.exact_for(tp) for tp in TPS)
    assert layout("qwen2.5-72b", 8).grid == 16


def test_reshard_refuses_bytes_the_source_rank_lacks() -> None:
    whole, halves = _layout("small", 1), _layout("small", 2)
    with pytest.raises(InvalidInputError, match=r"source rank 1 of tp=2 does not hold bytes"):
        whole.reshard(1, halves, 1, 0, 0.0, 1.0)
    assert whole.reshard(1, halves, 1, 0, 0.0, 0.5, partial=True) != []
    assert whole.reshard(1, halves, 0, 0, 0.25, 0.25) == []


def test_to_dict_is_plain_json() -> None:
    lay = _layout("padded", 2)
    data = json.loads(json.dumps(lay.to_dict()))
    assert (data["tp"], data["grid"], data["dtype_bytes"]) == (2, lay.grid, 2)
    assert data["model"]["name"] == MODELS["padded"].name
    assert [u["nbytes"] for u in data["units"]] == list(lay.unit_bytes)
    head = data["units"][-1]["tensors"][-1]
    assert head["name"] == "lm_head.weight" and head["rank_starts"] == [0, 50]
    assert head["global_rows"] == 99 and head["rank_shape"] == [50, 32]


# --- bad input --------------------------------------------------------------------------------


def test_bad_tp_and_model_are_named() -> None:
    with pytest.raises(InvalidInputError, match=r"tp=3 must divide"):
        layout("llama-3-8b", 3)
    with pytest.raises(InvalidInputError, match=r"tp must be a positive integer, got 0"):
        layout("llama-3-8b", 0)
    with pytest.raises(InvalidInputError, match=r"model 'no-such-model' is neither a preset"):
        layout("no-such-model", 1)
    with pytest.raises(InvalidInputError, match=r"model must be a ModelSpec or a preset name"):
        layout(42, 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"source_tp=3 is invalid: tp=3 must divide"):
        _layout("small", 1).exact_for(3)


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (mc.LLAMA_3_70B_GPTQ, r"cannot lay out model .*: its weights are quantized \(gptq\)"),
        (mc.LLAMA_3_8B_FP8_AUTOFP8, r"its weights are quantized \(fp8\)"),
        (mc.MISTRAL_SMALL_3_1, r"its vision tower is sized as a whole"),
        (
            {k: v for k, v in mc.DEEPSEEK_V3.items() if k != "quantization_config"},
            r"mlp.gate.e_score_correction_bias is stored with 4-byte elements",
        ),
    ],
)
def test_unsupported_model_kinds_are_refused(config: dict[str, object], why: str) -> None:
    with pytest.raises(InvalidInputError, match=why):
        layout(load_model(config), 1)


def test_bad_tensors_and_buffers_are_named() -> None:
    lay, full = _layout("small", 2), dict(_full("small"))
    name = "model.layers.0.mlp.up_proj.weight"
    with pytest.raises(InvalidInputError, match=rf"tensors\[{name!r}\] has shape \(64, 31\)"):
        lay.rank_buffer(1, 0, {**full, name: full[name][:, :31]})
    with pytest.raises(InvalidInputError, match=rf"tensors\[{name!r}\] has dtype float64"):
        lay.rank_buffer(1, 0, {**full, name: full[name].astype(np.float64)})
    del full[name]
    with pytest.raises(InvalidInputError, match=rf"tensors has no {name!r} \(unit 1\)"):
        lay.rank_buffer(1, 0, full)
    with pytest.raises(InvalidInputError, match=r"rank must be at most 1, got 2"):
        lay.rank_buffer(1, 2, _full("small"))
    with pytest.raises(InvalidInputError, match=r"unit must be at most 3, got 4"):
        lay.stripe_bytes(4, 0, 1)
    with pytest.raises(InvalidInputError, match=r"buffer must be \d+ uint8 bytes for unit 1"):
        lay.unpack(1, 0, np.zeros(5, dtype=np.uint8))
    with pytest.raises(InvalidInputError, match=r"dtype must have 4-byte elements"):
        lay.unpack(1, 0, _buffer("small", 2, 1, 0), dtype=np.float16)


def test_bad_stripes_and_sources_are_named() -> None:
    lay = _layout("small", 2)
    with pytest.raises(InvalidInputError, match=r"lo must be a number in \[0, 1\], got nan"):
        lay.stripe_bytes(0, float("nan"), 1)
    with pytest.raises(InvalidInputError, match=r"hi must be a number in \[0, 1\], got 1.5"):
        lay.stripe_bytes(0, 0, 1.5)
    with pytest.raises(InvalidInputError, match=r"lo must be <= hi, got lo=0.6 and hi=0.5"):
        lay.stripe_bytes(0, 0.6, 0.5)
    with pytest.raises(InvalidInputError, match=r"source is a layout of 'layout-test-llama'"):
        _layout("padded", 1).reshard(0, lay, 0, 0, 0, 1)
    with pytest.raises(InvalidInputError, match=r"source_rank must be at most 1, got 5"):
        lay.reshard(0, lay, 5, 0, 0, 1)
    with pytest.raises(InvalidInputError, match=r"source must be a Layout, got str"):
        lay.reshard(0, "small", 0, 0, 0, 1)  # type: ignore[arg-type]
