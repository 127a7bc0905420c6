"""Checks a quantized spec must pass before anything sizes it (raised at construction)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from blitzplan.errors import InvalidInputError
from blitzplan.models.layers import Linear, layer_modules

if TYPE_CHECKING:
    from blitzplan.models.spec import ModelSpec

__all__ = ["check_quantization"]


def _linears(spec: ModelSpec) -> list[tuple[str, Linear]]:
    """(full module name, linear) of every linear in every layer, next-token layers included."""
    found = []
    for index in range(spec.num_layers + spec.mtp_layers):
        prefix = f"model.layers.{index}."
        for module in layer_modules(spec, index):
            if isinstance(module, Linear):
                found += [(prefix + name, module) for name in module.names()]
    return found


def check_quantization(spec: ModelSpec) -> None:
    """Refuse a quantization whose rules name no module, or which quantizes a MoE router.

    A skip entry that names no module is most likely misnamed; sizing on would count as quantized
    a module the checkpoint keeps whole. Routers are sized unquantized (vLLM builds them so), so
    a compressed-tensors config that targets one is refused rather than sized wrongly.
    """
    quant = spec.quantization
    if quant is None:
        return
    if quant.skip or not quant.uniform or quant.method == "compressed-tensors":
        linears = _linears(spec)
        unmatched = quant.unmatched([name for name, _ in linears] + ["lm_head"])
        if unmatched:
            raise InvalidInputError(
                f"quantization_config of {spec.name} keeps unquantized {unmatched!r}, which name "
                "no module blitzplan sizes (names look like 'model.layers.0.self_attn.q_proj' "
                "or 'lm_head')"
            )
        routers = [name for name, linear in linears if not linear.quantizable]
        targeted = [name for name in routers if quant.format_for(name) is not None]
        if quant.method == "compressed-tensors" and targeted:
            raise InvalidInputError(
                f"quantization_config of {spec.name} quantizes MoE router {targeted[0]!r}; "
                "blitzplan sizes routers unquantized (as vLLM loads them); add it to 'ignore'"
            )
    problem = spec.quantized_split_problem(1)
    if problem:
        raise InvalidInputError(f"quantization_config of {spec.name} cannot store {problem}")
