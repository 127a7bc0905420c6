"""Byte arithmetic between two TP degrees of one model's layout: which bytes of a source rank's
buffer build a stripe of a target rank's buffer (:meth:`~blitzplan.models.layout.Layout.reshard`)
and whether on-grid stripes are served whole by single source ranks
(:meth:`~blitzplan.models.layout.Layout.exact_for`). The layouts check their arguments; this
module only counts bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from blitzplan.errors import InvalidInputError

if TYPE_CHECKING:
    from blitzplan.models.layout import Copy, Layout, UnitLayout
    from blitzplan.models.layout_tensors import TensorLayout

Side = tuple["Layout", "UnitLayout", int]
"""One end of a reshard: the layout, its record of the unit, and the rank."""


def copies(target: Side, source: Side, begin: int, length: int, partial: bool) -> list[Copy]:
    """Copies out of ``source``'s rank that build bytes ``[begin, begin + length)`` of
    ``target``'s rank; adjacent copies merged, sorted by destination."""
    layout, record, rank = target
    source_layout, source_record, source_rank = source
    found: list[Copy] = []
    for ours, theirs in zip(record.tensors, source_record.tensors, strict=True):
        for run in _runs(layout.grid, record, ours, rank, begin, begin + length):
            found += _copies(source_layout, source_record, theirs, source_rank, run, partial)
    return _merged(found)


def serves_on_grid(target: Layout, source: Layout, units: Iterable[int]) -> bool:
    """Whether every on-grid stripe of ``units`` (one per shape is enough) is held whole by one
    rank of ``source``: rank ``r * m + j`` for stripe ``[j / m, (j + 1) / m)`` of rank ``r`` of a
    source ``m`` times finer, rank ``r * source.tp // target.tp`` of a coarser or equal one."""
    m = max(1, source.tp // target.tp)
    return all(
        _serves(target.units[u].tensors, source.units[u].tensors, r, (j, m), server)
        for u in units
        for r in range(target.tp)
        for j in range(m)
        for server in [r * m + j if source.tp > target.tp else r * source.tp // target.tp]
    )


def _runs(
    grid: int, record: UnitLayout, tensor: TensorLayout, rank: int, begin: int, end: int
) -> Iterator[Copy]:
    """(dest offset, global byte, length) of ``tensor``'s bytes inside ``[begin, end)``;
    a global byte counts along the whole tensor's rows (``global_rows * row_bytes``)."""
    width, step = tensor.nbytes // grid, record.slice_bytes
    first = max(0, (begin - tensor.slice_offset - width) // step + 1)
    last = min(grid - 1, (end - tensor.slice_offset - 1) // step)
    base = tensor.rank_starts[rank] * tensor.row_bytes
    for k in range(first, last + 1):
        start = k * step + tensor.slice_offset
        low, high = max(begin, start), min(end, start + width)
        if low < high:
            yield low, base + k * width + low - start, high - low


def _copies(
    layout: Layout, record: UnitLayout, tensor: TensorLayout, rank: int, run: Copy, partial: bool
) -> Iterator[Copy]:
    """Copies out of ``layout``'s rank ``rank`` of the global bytes of ``run``."""
    dest, low, high = run[0], run[1], run[1] + run[2]
    held_start, held_stop = (row * tensor.row_bytes for row in tensor.held_rows(rank))
    high = min(high, tensor.global_rows * tensor.row_bytes)  # padding is not copied
    if not partial and low < high and not held_start <= low < high <= held_stop:
        raise InvalidInputError(
            f"source rank {rank} of tp={layout.tp} does not hold bytes [{low}, {high}) of "
            f"{tensor.name} (it holds [{held_start}, {held_stop}))"
        )
    dest += max(0, held_start - low)
    low, high = max(low, held_start), min(high, held_stop)
    width, local = tensor.nbytes // layout.grid, low - tensor.rank_starts[rank] * tensor.row_bytes
    while low < high:
        k, within = divmod(local, width)
        size = min(high - low, width - within)
        yield k * record.slice_bytes + tensor.slice_offset + within, dest, size
        low, local, dest = low + size, local + size, dest + size


def _merged(found: list[Copy]) -> list[Copy]:
    """Sorted by destination; a copy continuing the previous one in both buffers joins it."""
    merged: list[Copy] = []
    for src, dest, size in sorted(found, key=lambda c: c[1]):
        last_src, last_dest, last_size = merged[-1] if merged else (-1, -1, 0)
        if last_src + last_size == src and last_dest + last_size == dest:
            merged[-1] = (last_src, last_dest, last_size + size)
        else:
            merged.append((src, dest, size))
    return merged


def _serves(
    ours: tuple[TensorLayout, ...],
    theirs: tuple[TensorLayout, ...],
    rank: int,
    part: tuple[int, int],
    source_rank: int,
) -> bool:
    """Whether ``source_rank`` holds on-grid stripe ``[j / m, (j + 1) / m)`` of ``rank``
    (``part = (j, m)``), padding aside."""
    j, m = part
    for target, source in zip(ours, theirs, strict=True):
        start = target.rank_starts[rank]
        low = start + j * target.rows // m
        high = min(start + (j + 1) * target.rows // m, target.global_rows)
        held_low, held_high = source.held_rows(source_rank)
        if low < high and not held_low <= low < high <= held_high:
            return False
    return True
