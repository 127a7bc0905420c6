"""Model specs: published byte totals to the byte, per-family sizes, TP shards, errors."""

from __future__ import annotations

import json

import pytest

from blitzplan import InvalidInputError, list_models, load_model
from blitzplan.models import ModelSpec

# safetensors total_size (or 2 x published parameter count) from ../shared/models/MODELS.md
PUBLISHED_TOTAL_BYTES = {
    "llama-3-8b": 16_060_522_496,
    "llama-3.1-8b": 16_060_522_496,
    "llama-3-70b": 141_107_412_992,
    "mistral-small-24b": 47_144_806_400,
    "qwen2.5-7b": 2 * 7_615_616_512,
    "qwen2.5-72b": 2 * 72_706_203_648,
    "mixtral-8x7b": 93_405_585_408,
    # 2 x 6,738,415,616 parameters; the safetensors total_size, 13,476,839,424, also counts 32
    # fp32 rotary inv_freq buffers (8,192 bytes) that are no weights
    "llama-2-7b": 2 * 6_738_415_616,
}

LLAMA_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}


def test_presets_are_the_issue_list() -> None:
    assert sorted(PUBLISHED_TOTAL_BYTES) == list_models()


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL_BYTES))
def test_preset_total_bytes_match_published_totals(name: str) -> None:
    spec = load_model(name)
    assert spec.total_bytes == PUBLISHED_TOTAL_BYTES[name]
    assert sum(spec.unit_bytes()) == spec.total_bytes
    assert len(spec.unit_bytes()) == spec.num_layers + 2


def test_llama_8b_layer_families_by_hand() -> None:
    layer = load_model("llama-3-8b").layer
    assert (layer.q, layer.k, layer.v, layer.o) == (
        2 * 4096 * 4096,
        2 * 4096 * 1024,
        2 * 4096 * 1024,
        2 * 4096 * 4096,
    )
    assert layer.mlp == 2 * 3 * 4096 * 14336
    assert layer.norms == 2 * 2 * 4096
    assert layer.attention_bias == 0 and layer.router == 0


def test_qwen_has_qkv_bias_and_mistral_explicit_head_dim() -> None:
    qwen = load_model("qwen2.5-7b")
    assert qwen.qkv_bias and not qwen.o_bias
    assert qwen.layer.attention_bias == 2 * (3584 + 2 * 4 * 128)
    mistral = load_model("mistral-small-24b")
    assert mistral.head_dim == 128 != mistral.hidden_size // mistral.num_attention_heads
    assert mistral.layer.q == 2 * 5120 * 32 * 128


def test_mixtral_counts_experts_and_router() -> None:
    mixtral = load_model("mixtral-8x7b")
    assert mixtral.num_experts == 8 and mixtral.experts_per_token == 2
    assert mixtral.layer.router == 2 * 4096 * 8
    assert mixtral.layer.mlp == 8 * 2 * 3 * 4096 * 14336
    # published active parameters per token (top-2 of 8): 12,879,925,248
    embed_head = 2 * 32000 * 4096 + 4096
    assert mixtral.active_params_per_layer * 32 + embed_head == 12_879_925_248


def test_tied_embeddings_have_no_lm_head() -> None:
    spec = load_model({**LLAMA_8B, "tie_word_embeddings": True})
    assert spec.lm_head_bytes == 0
    assert spec.total_bytes == PUBLISHED_TOTAL_BYTES["llama-3-8b"] - spec.embedding_bytes


def test_kv_and_activation_bytes_per_token() -> None:
    spec = load_model("llama-3-70b")
    assert spec.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert spec.activation_bytes_per_token == 8192 * 2


def test_dtype_from_config_and_override() -> None:
    assert load_model({**LLAMA_8B, "torch_dtype": "float32"}).dtype_bytes == 4
    assert (
        load_model(LLAMA_8B, dtype_bytes=1).total_bytes * 2 == PUBLISHED_TOTAL_BYTES["llama-3-8b"]
    )


def test_tp_shard_of_dense_model_by_hand() -> None:
    spec = load_model("llama-3-8b")
    assert spec.shard(1).unit_bytes == spec.unit_bytes()
    shard = spec.shard(2)
    per_layer = (spec.layer_bytes - spec.layer.norms) // 2 + spec.layer.norms
    assert shard.unit_bytes[1] == per_layer
    assert shard.unit_bytes[0] == spec.embedding_bytes // 2
    assert shard.unit_bytes[-1] == spec.lm_head_bytes // 2 + spec.final_norm_bytes


def test_tp_beyond_kv_heads_replicates_them() -> None:
    spec = load_model({**LLAMA_8B, "num_key_value_heads": 2})
    layer = spec.layer
    split = layer.q + layer.o + layer.mlp
    one_kv_head_pair = 2 * 2 * 4096 * 128  # one K and one V head, bf16
    assert spec.shard(2).unit_bytes[1] == (split + layer.k + layer.v) // 2 + layer.norms
    assert spec.shard(8).unit_bytes[1] == split // 8 + one_kv_head_pair + layer.norms
    odd = load_model({**LLAMA_8B, "num_attention_heads": 24, "num_key_value_heads": 6})
    with pytest.raises(InvalidInputError, match=r"multiple of num_key_value_heads \(6\)"):
        odd.shard(4)


def test_identity_separates_revisions_and_models() -> None:
    a = load_model("llama-3-8b")
    assert a.identity == load_model("llama-3-8b").identity
    assert a.identity != load_model("llama-3-8b", revision="v2").identity
    assert a.identity != load_model("llama-3.1-8b").identity
    assert str(a.identity).startswith("llama-3-8b@main#")


def test_load_from_path(tmp_path) -> None:
    path = tmp_path / "my-llama" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(LLAMA_8B))
    assert load_model(path).total_bytes == PUBLISHED_TOTAL_BYTES["llama-3-8b"]
    assert load_model(path.parent).name == "my-llama"


def test_unknown_model_name_lists_presets() -> None:
    with pytest.raises(
        InvalidInputError, match=r"model 'llama-9b' is neither a preset.*llama-3-8b"
    ):
        load_model("llama-9b")


def test_config_missing_field_is_named() -> None:
    config = {k: v for k, v in LLAMA_8B.items() if k != "vocab_size"}
    with pytest.raises(InvalidInputError, match="missing required field.*vocab_size"):
        load_model(config)


def test_config_field_of_wrong_type_is_named() -> None:
    with pytest.raises(InvalidInputError, match="'hidden_size' must be an integer, got '4096'"):
        load_model({**LLAMA_8B, "hidden_size": "4096"})


def test_unknown_dtype_is_named() -> None:
    with pytest.raises(InvalidInputError, match="torch_dtype.*'float13'"):
        load_model({**LLAMA_8B, "torch_dtype": "float13"})


def test_bad_tp_is_named() -> None:
    with pytest.raises(InvalidInputError, match="tp=3 must divide num_attention_heads"):
        load_model("llama-3-8b").shard(3)
    with pytest.raises(InvalidInputError, match="tp must be a positive integer, got 0"):
        load_model("llama-3-8b").shard(0)


def test_invalid_json_file_is_named(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(InvalidInputError, match="is not valid JSON"):
        load_model(path)


def test_heads_must_be_multiple_of_kv_heads() -> None:
    with pytest.raises(InvalidInputError, match=r"num_attention_heads \(32\).*\(5\)"):
        ModelSpec.from_config({**LLAMA_8B, "num_key_value_heads": 5})
