"""The compute model against one GPU (`make gpu-check` runs it after the executor's check).

Run on a machine with a GPU: .venv/bin/python benchmarks/gpu_layers.py
The roofline (``RooflineComputeModel``) is fitted on A100 profiles only; on other GPUs it scales
the A100 efficiencies by the spec sheet. This measures, on the GPU present, the two kernel families
that carry most of a layer's time, for models and TP shards outside the calibration set, and prints
them beside the model's prediction for that GPU:

- **GEMMs**: the layer's four projections (QKV, O, gate-up, down) of one TP shard, bf16 ``torch.mm``
  (cuBLAS), for prefill (N prompt tokens) and decode (B requests);
- **attention**: ``scaled_dot_product_attention`` (flash) over the shard's heads, causal prefill of
  one N-token prompt, and one decode step of B requests with 1,024 tokens of context each.

Each family is captured in a CUDA graph and replayed (no launch gaps, as the profiles sum kernels);
the time is the median of 7 timings of 20 replays. Elementwise kernels, the KV write and the
all-reduce are not measured (unfused torch ops would say more about torch than about the GPU).
Nothing is asserted; without a GPU it prints that it skipped.
"""

from __future__ import annotations

import math
import statistics
import sys

import torch
import torch.nn.functional as F

import blitzplan
from blitzplan._table import format_table
from blitzplan.compute.roofline import RooflineComputeModel
from blitzplan.hardware import get_gpu

CASES = [("llama-3-8b", 1), ("mistral-small-24b", 1), ("qwen2.5-7b", 1), ("qwen2.5-72b", 4)]
"""Models and TP degrees: one TP shard's kernels run on the one GPU (no all-reduce)."""
PREFILL_TOKENS = [128, 512, 2048, 8192]
DECODE_BATCH = [1, 8, 32, 128]
CONTEXT = 1024
GPU_NAMES = {"H200": "h200", "H100": "h100", "A100": "a100"}


def _timed_ms(body: object) -> float:
    """Milliseconds one call of ``body`` keeps the GPU busy, from a CUDA graph's replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            body()  # type: ignore[operator]
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()  # type: ignore[operator]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    timings = []
    for _ in range(7):
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        timings.append(start.elapsed_time(end) / 20)
    return float(statistics.median(timings))


def _gemms_ms(shard: dict[str, int], tokens: int) -> float:
    h, q, kv, inter = shard["hidden"], shard["q"], shard["kv"], shard["inter"]
    x, attended, gated = (
        torch.randn(tokens, n, dtype=torch.bfloat16, device="cuda") for n in (h, q, inter)
    )
    weights = {
        "qkv": torch.randn(h, q + 2 * kv, dtype=torch.bfloat16, device="cuda"),
        "o": torch.randn(q, h, dtype=torch.bfloat16, device="cuda"),
        "gate_up": torch.randn(h, 2 * inter, dtype=torch.bfloat16, device="cuda"),
        "down": torch.randn(inter, h, dtype=torch.bfloat16, device="cuda"),
    }

    def body() -> None:
        torch.mm(x, weights["qkv"])
        torch.mm(attended, weights["o"])
        torch.mm(x, weights["gate_up"])
        torch.mm(gated, weights["down"])

    return _timed_ms(body)


def _attention_ms(shard: dict[str, int], *, batch: int, queries: int, keys: int) -> float:
    """The shard's query heads over its KV heads (grouped, as the KV cache holds them)."""
    heads, kv_heads, dim = shard["heads"], shard["kv_heads"], shard["head_dim"]
    q = torch.randn(batch, heads, queries, dim, dtype=torch.bfloat16, device="cuda")
    k, v = (
        torch.randn(batch, kv_heads, keys, dim, dtype=torch.bfloat16, device="cuda")
        for _ in range(2)
    )
    causal = queries > 1

    def body() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=heads != kv_heads)

    return _timed_ms(body)


def main() -> int:
    if not torch.cuda.is_available():
        skipped = [["gpu-layers", "skipped: no GPU on this machine"]]
        print(format_table(["check", "result"], skipped))
        return 0
    name = torch.cuda.get_device_name(0)
    gpu = next((v for k, v in GPU_NAMES.items() if k in name), None)
    if gpu is None:
        print(f"{name}: no spec sheet in blitzplan.hardware to predict it; skipped")
        return 0
    print(f"{name} (predicted as {get_gpu(gpu).name}), torch {torch.__version__}\n")
    rows: list[list[object]] = []
    errors: dict[str, list[float]] = {"gemm": [], "attention": []}
    for model_name, tp in CASES:
        spec = blitzplan.load_model(model_name)
        model = RooflineComputeModel(spec, get_gpu(gpu), tp=tp)
        shard = {
            "hidden": spec.hidden_size,
            "q": spec.num_attention_heads // tp * spec.head_dim,
            "kv": max(1, spec.num_kv_heads // tp) * spec.head_dim,
            "inter": spec.intermediate_size // tp,
            "heads": spec.num_attention_heads // tp,
            "kv_heads": max(1, spec.num_kv_heads // tp),
            "head_dim": spec.head_dim,
        }
        cases = [("prefill", n, model.prefill_kernels(n), n, 1, n, n) for n in PREFILL_TOKENS]
        cases += [
            ("decode", b, model.decode_kernels(b, CONTEXT), b, b, 1, CONTEXT) for b in DECODE_BATCH
        ]
        for phase, size, predicted, tokens, batch, queries, keys in cases:
            try:
                gemm = _gemms_ms(shard, tokens)
                attention = _attention_ms(shard, batch=batch, queries=queries, keys=keys)
            except Exception as error:  # the other cases still say what they measured
                print(f"{model_name} tp{tp} {phase} {size}: failed: {error!r}", flush=True)
                continue
            ratios = (gemm / (predicted.gemm_s * 1e3), attention / (predicted.attention_s * 1e3))
            errors["gemm"].append(abs(math.log(ratios[0])))
            errors["attention"].append(abs(math.log(ratios[1])))
            rows.append(
                [
                    *(model_name, tp, phase, size),
                    *(f"{gemm:.3f}", f"{predicted.gemm_s * 1e3:.3f}", f"{ratios[0]:.2f}"),
                    *(f"{attention:.3f}", f"{predicted.attention_s * 1e3:.3f}", f"{ratios[1]:.2f}"),
                ]
            )
            print(*rows[-1], sep=" | ", flush=True)  # as measured
    headers = ["model", "tp", "phase", "N or B", "GEMMs ms", "predicted", "ratio"]
    headers += ["attention ms", "predicted", "ratio"]
    print(format_table(headers, rows))
    for family, values in errors.items():
        typical = math.exp(statistics.median(values)) - 1
        worst = math.exp(max(values)) - 1
        print(f"{family}: median |error| {100 * typical:.0f}%, worst {100 * worst:.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
