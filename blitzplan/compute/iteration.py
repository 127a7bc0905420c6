"""The cost of one engine iteration that mixes prefill chunks and decodes (a colocated engine).

A colocated engine (vLLM, SGLang, Sarathi-Serve) runs one forward pass per iteration over every
request it scheduled: prefill chunks, each ``(tokens, prefix_tokens)`` (its new tokens and the
tokens of its request already in the KV cache, which it attends to), and decodes, one token
each over its cached context. :func:`iteration_s` prices the pass: ``num_layers`` layers of the
mixed batch and the lm_head over one position per scheduled request (vLLM computes logits at
the last scheduled position of every request, and drops those of unfinished chunks).

The calibrated roofline prices a mixed layer kernel by kernel
(:meth:`~blitzplan.compute.RooflineComputeModel.mixed_layer_s`). Any other
:class:`~blitzplan.compute.ComputeModel`, which knows only whole prompts and uniform decode
batches, is composed by :func:`composed_layer_s`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from blitzplan._checks import MAX_COUNT, check_count
from blitzplan.errors import InvalidInputError

if TYPE_CHECKING:
    from blitzplan.compute.protocol import ComputeModel

__all__ = ["chunk_sums", "composed_layer_s", "decode_sums", "iteration_s", "mixed_layer_s"]


def chunk_sums(chunks: Sequence[tuple[int, int]]) -> tuple[int, float, int]:
    """``(tokens, causal_pairs, prefix_tokens)`` of prefill chunks: their new tokens, the
    query-key pairs their causal attention scores (``c * (p + c / 2)`` per chunk of ``c`` tokens
    after ``p`` cached ones) and their cached tokens; each chunk checked."""
    tokens = prefix = 0
    pairs = 0.0
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, Sequence) or len(chunk) != 2:
            raise InvalidInputError(f"chunks[{i}] must be (tokens, prefix_tokens), got {chunk!r}")
        c, p = chunk
        if not (type(c) is int and type(p) is int and 1 <= c <= MAX_COUNT and 0 <= p <= MAX_COUNT):
            c = check_count(f"chunks[{i}] tokens", c)
            p = check_count(f"chunks[{i}] prefix_tokens", p, minimum=0)
        tokens, prefix, pairs = tokens + c, prefix + p, pairs + c * (p + c / 2)
    return tokens, pairs, prefix


def decode_sums(decode_contexts: Sequence[int]) -> tuple[int, int]:
    """``(batch_size, cached_tokens)`` of decodes with these contexts; each checked."""
    if all(type(c) is int and 0 <= c <= MAX_COUNT for c in decode_contexts):  # the common case
        return len(decode_contexts), sum(decode_contexts)
    cached = 0
    for i, context in enumerate(decode_contexts):
        cached += check_count(f"decode_contexts[{i}]", context, minimum=0)
    return len(decode_contexts), cached


def _check_batch(chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int]) -> None:
    if not chunks and not decode_contexts:
        raise InvalidInputError("a mixed batch needs at least one chunk or decode, got none")


def composed_layer_s(
    compute: ComputeModel, chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
) -> float:
    """One mixed layer from a model's three questions: decodes alone are a decode step at their
    mean context; with chunks, a prefill of every token of the batch plus the decodes' attention
    over their contexts (a decode step at their mean context less one at no context). The
    chunks' attention to their cached prefixes is not priced: such a model has no term for it."""
    _check_batch(chunks, decode_contexts)
    tokens, _, _ = chunk_sums(chunks)
    batch, cached = decode_sums(decode_contexts)
    context = cached // batch if batch else 0
    if not chunks:
        return compute.decode_layer_s(batch, context)
    layer = compute.prefill_layer_s(tokens + batch, requests=len(chunks) + batch)
    if batch:
        layer += compute.decode_layer_s(batch, context) - compute.decode_layer_s(batch, 0)
    return layer


def mixed_layer_s(
    compute: ComputeModel, chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
) -> float:
    """Seconds of one layer of a mixed batch: the model's own ``mixed_layer_s`` when it has one,
    else :func:`composed_layer_s`."""
    _check_batch(chunks, decode_contexts)
    own = getattr(compute, "mixed_layer_s", None)
    if callable(own):
        return float(own(chunks, decode_contexts))
    return composed_layer_s(compute, chunks, decode_contexts)


def iteration_s(
    compute: ComputeModel,
    num_layers: int,
    chunks: Sequence[tuple[int, int]],
    decode_contexts: Sequence[int],
) -> float:
    """Seconds of one iteration: ``num_layers`` mixed layers and the lm_head over one position
    per scheduled request (see the module docstring)."""
    layers = check_count("num_layers", num_layers)
    layer = mixed_layer_s(compute, chunks, decode_contexts)
    return layers * layer + compute.head_s(len(chunks) + len(decode_contexts))
