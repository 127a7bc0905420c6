"""Gemma-2 and Phi-3.5-MoE sized again (they were refused as unknown model types), and a config
without a dtype refused instead of sized as bfloat16."""

from __future__ import annotations

import pytest

from blitzplan import InvalidInputError, layout, load_model
from blitzplan.models.layers import layer_modules
from tests import model_configs as C


def test_gemma_2_9b_has_its_published_parameter_count() -> None:
    spec = load_model(C.GEMMA_2_9B)
    assert spec.total_params == 9_241_705_984  # the model card's 9,241,705,984
    assert spec.tie_word_embeddings and spec.lm_head_bytes == 0  # transformers' default
    assert spec.total_bytes == 4 * spec.total_params  # stored in float32
    names = [m.name for m in layer_modules(spec, 0)]
    assert {"pre_feedforward_layernorm", "post_feedforward_layernorm"} <= set(names)


def test_phi_3_5_moe_counts_its_biases() -> None:
    spec = load_model(C.PHI_3_5_MOE)
    h, vocab = 4096, 32064
    # 16 experts of 3 x 4096 x 6400, GQA with biases, LayerNorms with biases, a biased head
    layer = 16 * 3 * h * 6400 + h * 16 + (2 * h * h + 2 * h * 1024) + (2 * h + 2 * 1024)
    layer += 2 * 2 * h
    assert spec.total_params == 32 * layer + 2 * vocab * h + vocab + 2 * h == 41_873_153_344
    assert spec.total_bytes == 2 * spec.total_params
    tensors = [t.name for t in layout(spec, 2).units[-1].tensors]
    assert tensors == ["model.norm.weight", "model.norm.bias", "lm_head.weight", "lm_head.bias"]


def test_a_config_without_a_dtype_is_refused_not_guessed() -> None:
    config = {k: v for k, v in C.LLAMA_3_70B.items() if k != "torch_dtype"}
    with pytest.raises(InvalidInputError, match="names no dtype .* pass dtype_bytes"):
        load_model(config)
    assert load_model(config, dtype_bytes=2).total_bytes == load_model(C.LLAMA_3_70B).total_bytes
