"""A measured compute model: per-layer times interpolated from a table."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from blitzplan._checks import MAX_COUNT, MAX_SECONDS
from blitzplan.compute.iteration import composed_layer_s
from blitzplan.compute.protocol import ComputeModel
from blitzplan.compute.protocol import check_count_arg as _check_count
from blitzplan.errors import InvalidInputError

__all__ = ["TableComputeModel"]


def _interp(x: float, xs: np.ndarray, ys: np.ndarray) -> float:
    """Piecewise-linear through (xs, ys), extended linearly past both ends."""
    if len(xs) == 1:
        return float(ys[0])
    if x < xs[0]:
        slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        return float(ys[0] + slope * (x - xs[0]))
    if x > xs[-1]:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return float(ys[-1] + slope * (x - xs[-1]))
    return float(np.interp(x, xs, ys))


def _array(name: str, values: object) -> np.ndarray:
    try:
        return np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name} must hold numbers, got {values!r}") from None


def _axis(name: str, values: Sequence[float]) -> np.ndarray:
    array = _array(name, values)
    if array.ndim != 1 or len(array) == 0:
        raise InvalidInputError(f"{name} must be a non-empty 1-D sequence, got {values!r}")
    if np.any(~np.isfinite(array)) or np.any(array < 0) or np.any(array > MAX_COUNT):
        raise InvalidInputError(f"{name} must hold counts in [0, {MAX_COUNT}], got {values!r}")
    if np.any(np.diff(array) <= 0):
        raise InvalidInputError(f"{name} must be strictly increasing, got {list(values)!r}")
    return array


def _times(name: str, values: object, shape: tuple[int, ...]) -> np.ndarray:
    array = _array(name, values)
    if array.shape != shape:
        raise InvalidInputError(f"{name} must have shape {shape}, got {array.shape}")
    if np.any(~np.isfinite(array)) or np.any(array < 0) or np.any(array > MAX_SECONDS):
        raise InvalidInputError(
            f"{name} must hold finite times >= 0 (at most {MAX_SECONDS:g} s), "
            f"got {array.tolist()!r}"
        )
    return array


class TableComputeModel:
    """A measured compute model: piecewise-linear in tokens, bilinear in (batch, context).

    ``prefill_s[i]`` is the per-layer time at ``prefill_tokens[i]``; ``decode_s[i][j]`` the
    decode step at ``decode_batch_sizes[i]`` and ``decode_context_lens[j]``; ``head_s[i]`` the
    head at ``head_tokens[i]``. Outside the grid the nearest segment is extended linearly.
    Prefill here does not depend on the number of requests (the table measured one mix).
    """

    def __init__(
        self,
        *,
        prefill_tokens: Sequence[float],
        prefill_s: Sequence[float],
        decode_batch_sizes: Sequence[float],
        decode_context_lens: Sequence[float],
        decode_s: Sequence[Sequence[float]],
        head_tokens: Sequence[float],
        head_s: Sequence[float],
    ) -> None:
        self._prefill_x = _axis("prefill_tokens", prefill_tokens)
        self._prefill_y = _times("prefill_s", prefill_s, self._prefill_x.shape)
        self._batch_x = _axis("decode_batch_sizes", decode_batch_sizes)
        self._context_x = _axis("decode_context_lens", decode_context_lens)
        self._decode_y = _times("decode_s", decode_s, (len(self._batch_x), len(self._context_x)))
        self._head_x = _axis("head_tokens", head_tokens)
        self._head_y = _times("head_s", head_s, self._head_x.shape)

    @classmethod
    def tabulate(
        cls,
        model: ComputeModel,
        *,
        prefill_tokens: Sequence[int] = (1, 128, 512, 2048, 8192),
        decode_batch_sizes: Sequence[int] = (1, 8, 32, 128),
        decode_context_lens: Sequence[int] = (0, 512, 2048, 8192),
    ) -> TableComputeModel:
        """Sample another compute model on a grid (for tests, or to freeze a calibrated model)."""
        return cls(
            prefill_tokens=prefill_tokens,
            prefill_s=[model.prefill_layer_s(n) for n in prefill_tokens],
            decode_batch_sizes=decode_batch_sizes,
            decode_context_lens=decode_context_lens,
            decode_s=[
                [model.decode_layer_s(b, c) for c in decode_context_lens]
                for b in decode_batch_sizes
            ],
            head_tokens=prefill_tokens,
            head_s=[model.head_s(n) for n in prefill_tokens],
        )

    def prefill_layer_s(self, tokens: int, *, requests: int = 1) -> float:
        _check_count("tokens", tokens)
        _check_count("requests", requests)
        return max(0.0, _interp(tokens, self._prefill_x, self._prefill_y))

    def decode_layer_s(self, batch_size: int, context_len: int) -> float:
        _check_count("batch_size", batch_size)
        _check_count("context_len", context_len, minimum=0)
        per_batch = np.array([_interp(context_len, self._context_x, row) for row in self._decode_y])
        return max(0.0, _interp(batch_size, self._batch_x, per_batch))

    def head_s(self, tokens: int) -> float:
        _check_count("tokens", tokens)
        return max(0.0, _interp(tokens, self._head_x, self._head_y))

    def mixed_layer_s(
        self, chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int]
    ) -> float:
        """One layer of a mixed iteration, composed from the table
        (:func:`~blitzplan.compute.iteration.composed_layer_s`: no chunk-prefix term)."""
        return composed_layer_s(self, chunks, decode_contexts)
