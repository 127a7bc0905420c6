"""DeepSeek MLA + MoE, Qwen MoE with shared experts, Qwen3 qk-norms: sized against public figures.

Reference figures:

- DeepSeek-V3 main model: 671,026,419,200 parameters (the 671B of its report; the exact count is
  quoted in many public sources as a recount of its config). Routed experts: 58 MoE layers x 256
  x 3 x 7168 x 2048 = 653,908,770,816 (quoted in a public recount). Checkpoint: the Hub API's
  ``safetensors`` counts for deepseek-ai/DeepSeek-V3, ``{"BF16": 3918786560, "F8_E4M3":
  680571043840, "F32": 41555600}`` (total 684,531,386,000, quoted in public fixtures), give
  2 x BF16 + F8 + 4 x F32 = 688,574,839,360 bytes, main model plus the MTP layer. Published
  counts, bytes derived; matched to the byte.
- DeepSeek-V2-Lite: 15,706,484,224 parameters (a public model table and a public demo print).
- Qwen2-57B-A14B: 57,408,658,944 parameters (Hub ``safetensors.total``, quoted in a public test).
- Qwen1.5-MoE-A2.7B: 14,315,784,192 parameters (keras-hub preset metadata).
- Qwen3-8B: 8,190,735,360 BF16 parameters (Hub ``safetensors``, quoted publicly); without its
  q/k norms the count would be 9,216 short.
"""

from __future__ import annotations

import pytest

from blitzplan import InvalidInputError, RooflineComputeModel, get_gpu, load_model
from tests import model_configs as C

DEEPSEEK_EXPERT_PARAMS = 3 * 7168 * 2048


def test_deepseek_v3_main_model_is_671b_parameters() -> None:
    spec = load_model(C.DEEPSEEK_V3)
    assert spec.total_params == 671_026_419_200
    routed = sum(spec.is_moe_layer(i) for i in range(61)) * 256 * DEEPSEEK_EXPERT_PARAMS
    assert routed == 653_908_770_816


def test_deepseek_v3_checkpoint_bytes_match_published_dtype_counts() -> None:
    spec = load_model(C.DEEPSEEK_V3)
    assert spec.checkpoint_bytes == 2 * 3_918_786_560 + 680_571_043_840 + 4 * 41_555_600
    assert spec.checkpoint_bytes == spec.total_bytes + spec.mtp_bytes
    assert sum(spec.unit_bytes()) == spec.total_bytes
    assert spec.num_units == 63  # the MTP layer is not a unit: serving does not load it


def test_deepseek_v3_units_are_not_uniform() -> None:
    spec = load_model(C.DEEPSEEK_V3)
    units = spec.unit_bytes()
    dense, moe = units[1], units[4]
    assert units[1:4] == (dense,) * 3 and units[4:-1] == (moe,) * 58
    assert dense < moe and not spec.is_uniform
    assert spec.layer_bytes == moe == spec.layers[3].total  # the largest layer
    assert spec.layers[0].mlp < spec.layers[3].mlp and spec.layers[0].router == 0
    # MoE layer: 256 routed + 1 shared expert, a bf16 router and its float32 score bias
    assert spec.layers[3].router == 2 * 7168 * 256 + 4 * 256
    assert spec.active_params_per_layer == spec.params_per_layer - 248 * DEEPSEEK_EXPERT_PARAMS


def test_mla_caches_the_latent_and_rope_key_replicated_over_tp() -> None:
    spec = load_model(C.DEEPSEEK_V3)
    assert spec.kv_bytes_per_token == 61 * (512 + 64) * 2
    assert spec.shard(8).kv_bytes_per_token == spec.kv_bytes_per_token
    layer = spec.layers[3]
    assert layer.k == layer.v == 0 and layer.kv > 0
    assert layer.kv == (7168 * 576 + 4 * 5 * 56) + (512 * 128 * 256 + 4 * 256 * 4)


def test_deepseek_tp_shard_replicates_down_projections_and_routers() -> None:
    spec = load_model(C.DEEPSEEK_V3)
    whole, eight = spec.layers[3], spec.shard(8).unit_bytes[4]
    replicated = (7168 * 1536 + 4 * 12 * 56) + (7168 * 576 + 4 * 5 * 56)  # q_a, kv_a (fp8)
    replicated += whole.router + whole.norms
    split = whole.total - replicated
    assert eight == replicated + split // 8


def test_roofline_on_deepseek_reads_the_unsplit_mla_cache() -> None:
    spec = load_model(C.DEEPSEEK_V3)
    model = RooflineComputeModel(spec, get_gpu("h200"), tp=8)
    assert model.kv_bytes_per_token_layer == (512 + 64) * spec.dtype_bytes  # not split by TP
    llama = RooflineComputeModel(load_model("llama-3-8b"), get_gpu("h200"), tp=8)
    assert llama.kv_bytes_per_token_layer == 2 * 1 * 128 * 2  # 8 KV heads over 8 GPUs
    short, long = model.decode_layer_s(1, 1000), model.decode_layer_s(1, 100_000)
    assert long > short


def test_deepseek_v2_lite_mla_without_query_lora() -> None:
    spec = load_model(C.DEEPSEEK_V2_LITE)
    assert spec.total_params == 15_706_484_224
    assert spec.layers[1].q == 2 * 2048 * 16 * 192  # q_proj straight from the hidden state
    assert spec.layers[1].shared_mlp == 2 * 3 * 2048 * 2 * 1408  # two shared experts
    assert spec.layers[1].router == 2 * 2048 * 64  # no score-correction bias (greedy top-k)


def test_qwen2_57b_a14b_shared_expert_and_gate() -> None:
    spec = load_model(C.QWEN2_57B_A14B)
    assert spec.total_params == 57_408_658_944
    assert spec.total_bytes == 2 * 57_408_658_944
    assert spec.layer.shared_mlp == 2 * 3 * 3584 * 20480
    assert spec.layer.router == 2 * (3584 * 64 + 3584)  # router and shared_expert_gate
    active = 28 * spec.active_params_per_layer + 2 * 151936 * 3584 + 3584
    assert 14.2e9 < active < 14.3e9  # the "A14B" of its name


def test_qwen1_5_moe_a2_7b_parameters() -> None:
    assert load_model(C.QWEN1_5_MOE_A2_7B).total_params == 14_315_784_192


def test_qwen_mlp_only_layers_are_dense() -> None:
    spec = load_model({**C.QWEN1_5_MOE_A2_7B, "mlp_only_layers": [0]})
    assert spec.moe.dense_layers == (0,)
    assert spec.layers[0].mlp == 2 * 3 * 2048 * 5632 and spec.layers[0].router == 0
    assert spec.layers[1].mlp == 2 * 60 * 3 * 2048 * 1408


def test_qwen3_counts_its_qk_norms() -> None:
    spec = load_model(C.QWEN3_8B)
    assert spec.total_params == 8_190_735_360
    assert spec.layer.norms == 2 * (2 * 4096 + 2 * 128)


def test_shared_experts_and_dense_widths_bound_tp() -> None:
    spec = load_model(C.QWEN2_57B_A14B)
    spec.check_tp(4)
    with pytest.raises(InvalidInputError, match="tp=8 must divide num_attention_heads"):
        spec.check_tp(8)
    odd = load_model({**C.QWEN2_57B_A14B, "shared_expert_intermediate_size": 20482})
    with pytest.raises(
        InvalidInputError, match=r"tp=4 must divide shared_intermediate_size \(20482\)"
    ):
        odd.check_tp(4)


def test_unknown_model_type_is_refused_not_guessed() -> None:
    with pytest.raises(
        InvalidInputError, match="model_type' is 'falcon', which blitzplan does not size"
    ):
        load_model({**C.QWEN3_8B, "model_type": "falcon"})


def test_shared_expert_size_outside_qwen2_moe_is_refused() -> None:
    with pytest.raises(
        InvalidInputError, match="sized for model_type 'qwen2_moe' only, not 'mixtral'"
    ):
        load_model({**load_model("mixtral-8x7b").config, "shared_expert_intermediate_size": 14336})


def test_experts_per_token_beyond_experts_names_the_keys() -> None:
    config = {**C.DEEPSEEK_V3, "n_routed_experts": 4}
    with pytest.raises(
        InvalidInputError, match=r"num_experts_per_tok \(8\) must be <= .* \(4; read from"
    ):
        load_model(config)
