"""The steps of a transfer program (:mod:`.program` builds them and says what they mean):
:class:`TransferStep`, its :class:`StepKind` and the :class:`ByteRange` it moves."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["ByteRange", "StepKind", "TransferStep"]


class StepKind(StrEnum):
    NETWORK = "network"
    """Between hosts: out of ``nic`` (``relay``'s NIC when set), through the switches."""
    HOST_TO_DEVICE = "host_to_device"
    """Host DRAM to a GPU of the same host over PCIe."""
    DEVICE_TO_DEVICE = "device_to_device"
    """GPU to GPU inside one host (``link``: NVLink or PCIe)."""
    ALLGATHER = "allgather"
    """Inside one new instance's NVLink group: the bytes one GPU received, to its peers of the
    same rank (completing every GPU's buffer)."""
    DISK_TO_HOST = "disk_to_host"
    """SSD to host DRAM (the ServerlessLLM baseline's cache miss)."""


@dataclass(frozen=True)
class ByteRange:
    """Bytes ``[offset, offset + length)`` of each unit ``first_unit..last_unit``'s buffer."""

    first_unit: int
    last_unit: int
    offset: int
    length: int


@dataclass(frozen=True)
class TransferStep:
    """One stream of a stripe from a holder to a GPU (see the module docstring)."""

    id: int
    kind: StepKind
    source: str
    destination: str
    holder: str
    """What ``source`` is: ``instance`` (a GPU of a serving instance: its own buffer, of
    ``source_layout`` when set), ``loading`` (a GPU of an instance still loading under an earlier
    plan: its buffer fills as that plan delivers, and a chunk leaves once it is there),
    ``memory`` (host DRAM: every rank's buffer), ``disk`` (an SSD), or ``plan`` (a GPU that
    receives in this plan, a new instance's or a relay)."""
    instance: str | None
    """The new instance the destination GPU belongs to; None for a spare GPU that relays."""
    rank: int
    stripe: tuple[float, float]
    ranges: tuple[ByteRange, ...]
    bytes: int
    link: str
    """``network``, ``nvlink`` or ``pcie``: what the route crosses."""
    nic: str | None = None
    relay: str | None = None
    """Another GPU of the source's host whose NIC sends (a spare GPU or a new instance's;
    chunks are staged there over NVLink or PCIe, then leave through ``nic``)."""
    source_layout: tuple[int, int] | None = None
    feeds: tuple[int, ...] = ()
    after: tuple[int, ...] = ()
    store_and_forward: bool = False
    pace_bytes_per_s: float | None = None
    chunk_bytes: int = 0
    """The largest chunk the step sends (the plan's ``chunk_bytes``; its predictions assume it)."""
    rate_bytes_per_s: float = 0.0
    """The predicted rate of the step (max-min fair on what the state's background flows leave
    of each link it crosses); ``start_s``/``end_s`` follow from it."""
    not_before_s: float = 0.0
    start_s: float = 0.0
    end_s: float = 0.0
