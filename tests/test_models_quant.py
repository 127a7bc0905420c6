"""Quantized checkpoints: GPTQ, AWQ, FP8 and compressed-tensors FP8 sized as they are stored.

Reference figures (bytes), where they come from, and whether they are published or derived:

- Llama-3(.x)-70B AWQ GEMM 4-bit g128: 39,767,785,472 -- ``total_size`` of a 70B AWQ
  ``model.safetensors.index.json`` (80 layers, ``q_proj.qweight``, 9 shards) quoted in a public
  Go test; the search tool did not name its repository. Published; matched to the byte.
- Llama-3.x-70B compressed-tensors FP8-dynamic (per-channel scales): element counts by dtype
  ``{"BF16": 2109382656, "F8_E4M3": 68451041280}`` as the Hub API reports them, quoted in a public
  docstring (the model id is not named there) -> 2 x 2,109,382,656 + 68,451,041,280 =
  72,669,806,592. Published counts, bytes derived; matched to the byte.
- Llama-3(.x)-70B GPTQ 4-bit g128 (39,792,689,152) and Llama-3-8B AutoFP8 static
  (9,081,202,432): no published total found offline; derived from the tensor layouts in
  ``blitzplan.models.quant`` and checked here tensor by tensor.
"""

from __future__ import annotations

import pytest

from blitzplan import InvalidInputError, load_model
from blitzplan.models import WeightFormat
from tests import model_configs as C

LLAMA_70B_BF16_BYTES = 141_107_412_992  # safetensors total_size of Meta-Llama-3-70B (presets)
LLAMA_70B_LINEARS = [  # (in, out) of q, k, v, o, gate, up, down
    (8192, 8192), (8192, 1024), (8192, 1024), (8192, 8192),
    (8192, 28672), (8192, 28672), (28672, 8192),
]  # fmt: skip
EMBED_HEAD_FP16 = 2 * 2 * 128256 * 8192
NORMS_70B_FP16 = 2 * (80 * 2 * 8192 + 8192)  # two per layer plus the final norm


def test_gptq_k_proj_by_hand() -> None:
    # qweight int32 (8192*4/32, 1024), qzeros int32 (64, 1024*4/32), scales fp16 (64, 1024),
    # g_idx int32 (8192,)
    fmt = WeightFormat("gptq", bits=4, group_size=128, scale_bytes=2)
    assert fmt.weight_bytes(8192, 1024) == 4 * 1024 * 1024 + 4 * 64 * 128 + 2 * 64 * 1024 + 4 * 8192


def test_awq_k_proj_by_hand() -> None:
    # qweight int32 (8192, 1024/8), qzeros int32 (64, 1024/8), scales fp16 (64, 1024); no g_idx
    fmt = WeightFormat("awq", bits=4, group_size=128, scale_bytes=2)
    assert fmt.weight_bytes(8192, 1024) == 4 * 8192 * 128 + 4 * 64 * 128 + 2 * 64 * 1024


def test_fp8_formats_by_hand() -> None:
    assert WeightFormat("fp8_block", block=(128, 128)).weight_bytes(7168, 576) == (
        7168 * 576 + 4 * 5 * 56  # float8 weight, float32 scale_inv (ceil(576/128), 7168/128)
    )
    assert WeightFormat("fp8_tensor", input_scale=True).weight_bytes(4096, 1024) == 4096 * 1024 + 8
    assert WeightFormat("fp8_channel", scale_bytes=2).weight_bytes(4096, 1024) == 4096 * 1024 + 2048


def test_gptq_70b_is_sized_quantized_not_as_bf16() -> None:
    spec = load_model(C.LLAMA_3_70B_GPTQ)
    fmt = WeightFormat("gptq", bits=4, group_size=128, scale_bytes=2)
    linears = sum(fmt.weight_bytes(k, n) for k, n in LLAMA_70B_LINEARS)
    assert spec.total_bytes == 80 * linears + EMBED_HEAD_FP16 + NORMS_70B_FP16 == 39_792_689_152
    assert spec.total_bytes < LLAMA_70B_BF16_BYTES / 3
    assert sum(spec.unit_bytes()) == spec.total_bytes
    assert spec.unit_bytes()[0] == spec.unit_bytes()[-1] - 2 * 8192 == 2 * 128256 * 8192


def test_awq_70b_matches_published_index_total() -> None:
    assert load_model(C.LLAMA_3_70B_AWQ).total_bytes == 39_767_785_472


def test_compressed_tensors_fp8_dynamic_70b_matches_published_dtype_counts() -> None:
    spec = load_model(C.LLAMA_3_70B_FP8_DYNAMIC)
    assert spec.total_bytes == 2 * 2_109_382_656 + 68_451_041_280
    assert spec.total_params == 70_553_706_496  # quantization does not change the count


def test_autofp8_static_8b_per_tensor_scales() -> None:
    spec = load_model(C.LLAMA_3_8B_FP8_AUTOFP8)
    linears = 32 * 218_103_808  # Llama-3-8B's seven projections per layer, one byte each
    scales = 32 * 7 * (4 + 4)  # a float32 weight_scale and input_scale per projection
    kept = 2 * (2 * 128256 * 4096 + 32 * 2 * 4096 + 4096)  # embed, lm_head, norms in bf16
    assert spec.total_bytes == linears + scales + kept == 9_081_202_432


def test_quantized_tp_shard_splits_groups_with_the_linear() -> None:
    spec = load_model(C.LLAMA_3_70B_AWQ)
    fmt = WeightFormat("awq", bits=4, group_size=128, scale_bytes=2)
    per_gpu = [(8192, 1024), (8192, 128), (8192, 128), (1024, 8192)]  # q, k, v (1 KV head), o
    per_gpu += [(8192, 3584), (8192, 3584), (3584, 8192)]  # gate, up, down
    layer = sum(fmt.weight_bytes(k, n) for k, n in per_gpu) + 2 * 2 * 8192
    shard = spec.shard(8)
    assert shard.unit_bytes[1] == layer
    assert shard.unit_bytes[0] == 2 * 128256 // 8 * 8192
    assert shard.kv_bytes_per_token == 2 * 80 * 1 * 128 * 2


def test_fp8_ignored_layer_makes_that_layer_heavier() -> None:
    config = {**C.LLAMA_3_8B_FP8_AUTOFP8}
    config["quantization_config"] = {
        **config["quantization_config"],
        "ignored_layers": ["lm_head", "model.layers.0.mlp.down_proj"],
    }
    spec, base = load_model(config), load_model(C.LLAMA_3_8B_FP8_AUTOFP8)
    extra = 2 * 14336 * 4096 - (14336 * 4096 + 8)  # bf16 down_proj instead of fp8 + two scales
    assert spec.unit_bytes()[1] == base.unit_bytes()[1] + extra
    assert spec.unit_bytes()[2:] == base.unit_bytes()[2:]
    assert not spec.is_uniform and base.is_uniform
    assert spec.layer_bytes == spec.unit_bytes()[1]  # the largest layer


def test_awq_modules_to_not_convert_match_as_substrings() -> None:
    mixtral = {
        **load_model("mixtral-8x7b").config,
        "torch_dtype": "float16",
        "quantization_config": {"bits": 4, "group_size": 128, "quant_method": "awq"},
    }
    plain = load_model(mixtral)
    skip_gate = {**mixtral["quantization_config"], "modules_to_not_convert": ["gate"]}
    assert (
        load_model({**mixtral, "quantization_config": skip_gate}).total_bytes == plain.total_bytes
    )
    assert plain.layer.router == 2 * 4096 * 8  # routers stay float16 either way
    skip_w2 = {**mixtral["quantization_config"], "modules_to_not_convert": ["w2"]}
    unquantized_down = load_model({**mixtral, "quantization_config": skip_w2})
    down = WeightFormat("awq", bits=4, group_size=128, scale_bytes=2).weight_bytes(14336, 4096)
    assert unquantized_down.layer.mlp == plain.layer.mlp + 8 * (2 * 14336 * 4096 - down)


def test_gptq_lm_head_and_modules_in_block() -> None:
    base = {**C.LLAMA_3_70B_GPTQ["quantization_config"]}
    head = load_model({**C.LLAMA_3_70B_GPTQ, "quantization_config": {**base, "lm_head": True}})
    fmt = WeightFormat("gptq", bits=4, group_size=128, scale_bytes=2)
    assert head.lm_head_bytes == fmt.weight_bytes(8192, 128256)
    attention_only = [
        ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
        ["self_attn.o_proj"],
    ]
    config = {**base, "modules_in_block_to_quantize": attention_only}
    partial = load_model({**C.LLAMA_3_70B_GPTQ, "quantization_config": config})
    assert partial.layer.mlp == 2 * 3 * 8192 * 28672
    assert partial.layer.q == fmt.weight_bytes(8192, 8192)


def test_deepseek_fp8_blocks_refuse_a_tp_that_cuts_blocks() -> None:
    spec = load_model(C.DEEPSEEK_V3)
    spec.check_tp(16)  # 2048 / 16 = 128: whole blocks
    with pytest.raises(InvalidInputError, match=r"tp=32 cannot split .*not whole FP8 blocks"):
        spec.check_tp(32)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            {"quant_method": "bitsandbytes"},
            "quant_method 'bitsandbytes' is not one blitzplan sizes",
        ),
        ({"bits": 5}, r"bits must be one of \(2, 3, 4, 8\) for GPTQ, got 5"),
        ({"checkpoint_format": "marlin"}, "checkpoint_format 'marlin' stores kernel-repacked"),
        ({"dynamic": {"-:.*down": {}}}, "dynamic overrides bits or group size"),
    ],
)
def test_gptq_and_unknown_methods_are_refused_with_the_reason(change: dict, match: str) -> None:
    config = {**C.LLAMA_3_70B_GPTQ["quantization_config"], **change}
    with pytest.raises(InvalidInputError, match=match):
        load_model({**C.LLAMA_3_70B_GPTQ, "quantization_config": config})


def test_awq_layouts_other_than_gemm_are_refused() -> None:
    config = {**C.LLAMA_3_70B_AWQ["quantization_config"], "version": "gemv"}
    with pytest.raises(InvalidInputError, match="version 'gemv' stores AWQ tensors in a layout"):
        load_model({**C.LLAMA_3_70B_AWQ, "quantization_config": config})


def test_misnamed_skip_entry_is_refused() -> None:
    config = {
        **C.LLAMA_3_8B_FP8_AUTOFP8["quantization_config"],
        "ignored_layers": ["lm_head", "fc2"],
    }
    with pytest.raises(
        InvalidInputError, match=r"keeps unquantized \['fc2'\], which name no module"
    ):
        load_model({**C.LLAMA_3_8B_FP8_AUTOFP8, "quantization_config": config})


def test_compressed_tensors_int4_is_refused_with_the_reason() -> None:
    ct = C.LLAMA_3_70B_FP8_DYNAMIC["quantization_config"]
    group = {
        **ct["config_groups"]["group_0"],
        "weights": {"num_bits": 4, "type": "int", "strategy": "group"},
    }
    config = {**ct, "format": "pack-quantized", "config_groups": {"group_0": group}}
    with pytest.raises(
        InvalidInputError, match="format is 'pack-quantized'.*only in the 'float-quantized'"
    ):
        load_model({**C.LLAMA_3_70B, "quantization_config": config})


def test_compressed_tensors_that_quantizes_a_router_is_refused() -> None:
    config = {
        **C.QWEN1_5_MOE_A2_7B,
        "quantization_config": C.LLAMA_3_70B_FP8_DYNAMIC["quantization_config"],
    }
    with pytest.raises(InvalidInputError, match=r"quantizes MoE router 'model.layers.0.mlp.gate'"):
        load_model(config)
    ct = config["quantization_config"]
    ignore = ["lm_head", "re:.*mlp.gate$", "re:.*shared_expert_gate$"]
    spec = load_model({**config, "quantization_config": {**ct, "ignore": ignore}})
    assert spec.layer.router == 2 * (2048 * 60 + 2048)  # router and shared-expert gate in bf16
