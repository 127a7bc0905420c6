"""Per-layer compute times: a calibrated roofline on a GPU spec, or a measured table.

Every planner, the simulator and the executor ask a :class:`ComputeModel` three questions: how
long one decoder layer takes to prefill a batch of tokens, how long one decode step of one layer
takes for a batch at a context length, and how long the lm_head takes for some tokens. Colocated
engines also ask for one layer of a batch that mixes prefill chunks and decodes
(``mixed_layer_s``). Times are per GPU of a tensor-parallel instance, including its all-reduces,
with kernels back to back (the host's launch gaps are not modelled: CUDA graphs remove them in
decode).

One module per model: :mod:`.roofline` (the calibrated roofline), :mod:`.measured` (a measured
table); :mod:`.protocol` says what every model answers, :mod:`.iteration` prices a colocated
engine's mixed iteration from any of them.
"""

from __future__ import annotations

from blitzplan.compute.measured import TableComputeModel
from blitzplan.compute.protocol import ComputeModel, KernelTimes
from blitzplan.compute.roofline import RooflineComputeModel

__all__ = ["ComputeModel", "KernelTimes", "RooflineComputeModel", "TableComputeModel"]
