"""Realistic config.json dicts of public checkpoints, written from their published configs.

The architecture fields are those of the Hugging Face config.json files named in each docstring
(recalled, not downloaded: this machine has no internet); fields that do not affect sizing
(token ids, rope scaling, initializer range) are left out. The reference totals the tests compare
with, and where each comes from, are in the tests that use these configs.
"""

from __future__ import annotations

from typing import Any

LLAMA_3_70B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "hidden_act": "silu",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
"""meta-llama/Meta-Llama-3-70B (Llama-3.1/3.3-70B share every sizing field)."""

LLAMA_3_70B_GPTQ: dict[str, Any] = {
    **LLAMA_3_70B,
    "torch_dtype": "float16",
    "quantization_config": {
        "bits": 4,
        "damp_percent": 0.1,
        "desc_act": True,
        "group_size": 128,
        "modules_in_block_to_quantize": None,
        "quant_method": "gptq",
        "sym": True,
        "true_sequential": True,
    },
}
"""A 4-bit, group-128 GPTQ Llama-3(.1)-70B as AutoGPTQ / optimum write it
(e.g. hugging-quants/Meta-Llama-3.1-70B-Instruct-GPTQ-INT4)."""

LLAMA_3_70B_AWQ: dict[str, Any] = {
    **LLAMA_3_70B,
    "torch_dtype": "float16",
    "quantization_config": {
        "bits": 4,
        "group_size": 128,
        "modules_to_not_convert": None,
        "quant_method": "awq",
        "version": "gemm",
        "zero_point": True,
    },
}
"""A 4-bit, group-128 AWQ GEMM Llama-3(.1)-70B (e.g. hugging-quants/...-AWQ-INT4)."""

LLAMA_3_8B_FP8_AUTOFP8: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
    "quantization_config": {
        "activation_scheme": "static",
        "ignored_layers": ["lm_head"],
        "quant_method": "fp8",
    },
}
"""neuralmagic/Meta-Llama-3-8B-Instruct-FP8 (AutoFP8: per-tensor scales, static activations)."""

LLAMA_3_70B_FP8_DYNAMIC: dict[str, Any] = {
    **LLAMA_3_70B,
    "quantization_config": {
        "config_groups": {
            "group_0": {
                "input_activations": {
                    "dynamic": True,
                    "num_bits": 8,
                    "strategy": "token",
                    "symmetric": True,
                    "type": "float",
                },
                "output_activations": None,
                "targets": ["Linear"],
                "weights": {
                    "dynamic": False,
                    "num_bits": 8,
                    "observer": "minmax",
                    "strategy": "channel",
                    "symmetric": True,
                    "type": "float",
                },
            }
        },
        "format": "float-quantized",
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    },
}
"""An llm-compressor "FP8-dynamic" Llama-3.x-70B (compressed-tensors, per-channel weight scales,
dynamic per-token activations), as RedHatAI/neuralmagic publish them."""

DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
    "rms_norm_eps": 1e-06,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "v_head_dim": 128,
    "vocab_size": 129280,
}
"""deepseek-ai/DeepSeek-V3 (FP8 with 128 x 128 weight blocks, one MTP layer in the checkpoint)."""

MISTRAL_SMALL_3_1: dict[str, Any] = {
    "architectures": ["Mistral3ForConditionalGeneration"],
    "image_token_index": 10,
    "model_type": "mistral3",
    "multimodal_projector_bias": False,
    "projector_hidden_act": "gelu",
    "spatial_merge_size": 2,
    "text_config": {
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "intermediate_size": 32768,
        "max_position_embeddings": 131072,
        "model_type": "mistral",
        "num_attention_heads": 32,
        "num_hidden_layers": 40,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000000.0,
        "sliding_window": None,
        "vocab_size": 131072,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "image_size": 1540,
        "intermediate_size": 4096,
        "model_type": "pixtral",
        "num_attention_heads": 16,
        "num_channels": 3,
        "num_hidden_layers": 24,
        "patch_size": 14,
        "rope_theta": 10000.0,
    },
    "vision_feature_layer": -1,
}
"""mistralai/Mistral-Small-3.1-24B-Instruct-2503 (Mistral-Small-3.2-24B-Instruct-2506 has the
same sizes)."""

QWEN2_57B_A14B: dict[str, Any] = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "decoder_sparse_step": 1,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "model_type": "qwen2_moe",
    "moe_intermediate_size": 2560,
    "norm_topk_prob": False,
    "num_attention_heads": 28,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "shared_expert_intermediate_size": 20480,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
"""Qwen/Qwen2-57B-A14B."""

QWEN1_5_MOE_A2_7B: dict[str, Any] = {
    **QWEN2_57B_A14B,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "num_attention_heads": 16,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 16,
    "shared_expert_intermediate_size": 5632,
}
"""Qwen/Qwen1.5-MoE-A2.7B (model_type qwen2_moe)."""

QWEN3_8B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "head_dim": 128,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
"""Qwen/Qwen3-8B (q_norm and k_norm in every attention block)."""

DEEPSEEK_V2_LITE: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "first_k_dense_replace": 1,
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "kv_lora_rank": 512,
    "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408,
    "moe_layer_freq": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_attention_heads": 16,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 27,
    "num_key_value_heads": 16,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "tie_word_embeddings": False,
    "topk_method": "greedy",
    "torch_dtype": "bfloat16",
    "v_head_dim": 128,
    "vocab_size": 102400,
}
"""deepseek-ai/DeepSeek-V2-Lite (MLA without a query LoRA, two shared experts, no score bias)."""

# google/gemma-2-9b (the base checkpoint, stored in float32)
GEMMA_2_9B: dict[str, Any] = {
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "torch_dtype": "float32",
    "vocab_size": 256000,
}

# microsoft/Phi-3.5-MoE-instruct
PHI_3_5_MOE: dict[str, Any] = {
    "architectures": ["PhiMoEForCausalLM"],
    "attention_bias": True,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 6400,
    "lm_head_bias": True,
    "max_position_embeddings": 131072,
    "model_type": "phimoe",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 16,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32064,
}
