"""Reading a config.json's ``quantization_config`` into a :class:`~.quant.Quantization`.

A method or option whose stored tensors the config does not pin down is refused with the reason,
never sized by a guess.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from blitzplan._checks import check_count
from blitzplan.errors import InvalidInputError
from blitzplan.models.quant import (
    ALL_LINEARS,
    AWQ_BITS,
    FLOAT16_BYTES,
    GPTQ_BITS,
    Quantization,
    WeightFormat,
)

__all__ = ["parse_quantization"]

_KEY = "quantization_config"
_CT_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def parse_quantization(config: Mapping[str, Any], *, dtype_bytes: int) -> Quantization | None:
    """The quantization a config.json describes, or None for an unquantized checkpoint.

    ``dtype_bytes`` is the model dtype's width (compressed-tensors stores scales in it).
    """
    raw = config.get(_KEY, config.get("compression_config"))
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise InvalidInputError(f"config.json field {_KEY!r} must be an object, got {raw!r}")
    method = raw.get("quant_method")
    parser = _PARSERS.get(str(method))
    if parser is None:
        raise InvalidInputError(
            f"{_KEY}.quant_method {method!r} is not one blitzplan sizes; known: "
            f"{', '.join(sorted(_PARSERS))}"
        )
    return parser(raw, dtype_bytes)


def _first(raw: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if raw.get(key) is not None:
            return raw[key]
    return default


def _positive_int(key: str, value: Any) -> int:
    return check_count(f"{_KEY}.{key}", value)


def _names(raw: Mapping[str, Any], key: str) -> tuple[str, ...]:
    """A list of module names, flattening one level of nesting (GPTQ's list of lists)."""
    value = raw.get(key) or []
    if not isinstance(value, list):
        raise InvalidInputError(f"{_KEY}.{key} must list module names, got {value!r}")
    flat = [name for item in value for name in (item if isinstance(item, list) else [item])]
    if not all(isinstance(name, str) for name in flat):
        raise InvalidInputError(f"{_KEY}.{key} must list module names, got {value!r}")
    return tuple(flat)


def _gptq(raw: Mapping[str, Any], dtype_bytes: int) -> Quantization:
    bits = raw.get("bits")
    if bits not in GPTQ_BITS:
        raise InvalidInputError(f"{_KEY}.bits must be one of {GPTQ_BITS} for GPTQ, got {bits!r}")
    group = raw.get("group_size", 128)
    group = 0 if group == -1 else _positive_int("group_size", group)
    layout = "marlin" if raw.get("is_marlin_format") else str(raw.get("checkpoint_format", "gptq"))
    if layout not in ("gptq", "gptq_v2"):
        raise InvalidInputError(
            f"{_KEY}.checkpoint_format {layout!r} stores kernel-repacked tensors that blitzplan "
            "does not size; only 'gptq' and 'gptq_v2' checkpoints are"
        )
    if raw.get("dynamic"):
        raise InvalidInputError(
            f"{_KEY}.dynamic overrides bits or group size per module; blitzplan sizes GPTQ "
            "checkpoints that use one bits/group_size for every quantized module"
        )
    fmt = WeightFormat("gptq", bits=bits, group_size=group, scale_bytes=FLOAT16_BYTES)
    return Quantization(
        "gptq",
        (((ALL_LINEARS,), fmt),),
        only=_names(raw, "modules_in_block_to_quantize"),
        lm_head=bool(raw.get("lm_head", False)),
    )


def _awq(raw: Mapping[str, Any], dtype_bytes: int) -> Quantization:
    bits = _first(raw, "bits", "w_bit")
    if bits != AWQ_BITS:
        raise InvalidInputError(f"{_KEY}.bits must be {AWQ_BITS} for AWQ, got {bits!r}")
    group = _positive_int("group_size", _first(raw, "group_size", "q_group_size", default=128))
    version = str(_first(raw, "version", default="gemm")).lower()
    if version != "gemm":
        raise InvalidInputError(
            f"{_KEY}.version {version!r} stores AWQ tensors in a layout blitzplan does not "
            "size; only 'gemm' checkpoints are (AutoAWQ's default)"
        )
    fmt = WeightFormat("awq", bits=AWQ_BITS, group_size=group, scale_bytes=FLOAT16_BYTES)
    skip = _names(raw, "modules_to_not_convert")
    return Quantization("awq", (((ALL_LINEARS,), fmt),), skip=skip, skip_match="substring")


def _fp8(raw: Mapping[str, Any], dtype_bytes: int) -> Quantization:
    scheme = raw.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise InvalidInputError(
            f"{_KEY}.activation_scheme must be 'dynamic' or 'static', got {scheme!r}"
        )
    block = raw.get("weight_block_size")
    if block is None:
        fmt = WeightFormat("fp8_tensor", input_scale=scheme == "static")
    else:
        if not isinstance(block, list) or len(block) != 2:
            raise InvalidInputError(f"{_KEY}.weight_block_size must be [rows, cols], got {block!r}")
        if scheme == "static":
            raise InvalidInputError(
                f"{_KEY}: FP8 blocks with static activation scales are not a checkpoint layout "
                "blitzplan (or vLLM) knows"
            )
        rows, cols = (_positive_int("weight_block_size", size) for size in block)
        fmt = WeightFormat("fp8_block", block=(rows, cols))
    skip = _names(raw, "ignored_layers") or _names(raw, "modules_to_not_convert")
    return Quantization("fp8", (((ALL_LINEARS,), fmt),), skip=skip)


def _ct_refuse(where: str, what: str) -> InvalidInputError:
    return InvalidInputError(
        f"{_KEY}.{where} is {what}; blitzplan sizes compressed-tensors checkpoints only in the "
        "'float-quantized' format with symmetric 8-bit float weights and 'tensor' or 'channel' "
        "scales, whose stored tensors the config fixes. Packed integer formats add zero points, "
        "group indices and shape tensors that depend on the compressor's options and version"
    )


def _ct_format(
    name: str, group: Mapping[str, Any], top_format: Any, dtype_bytes: int
) -> WeightFormat:
    fmt = group.get("format", top_format)
    if fmt != "float-quantized":
        raise _ct_refuse(f"config_groups.{name}.format", repr(fmt))
    weights = group.get("weights") or {}
    strategy = weights.get("strategy")
    if (weights.get("type"), weights.get("num_bits")) != ("float", 8):
        raise _ct_refuse(f"config_groups.{name}.weights", "not 8-bit float")
    if strategy not in ("tensor", "channel") or not weights.get("symmetric", True):
        raise _ct_refuse(f"config_groups.{name}.weights.strategy", repr(strategy))
    if weights.get("dynamic"):
        raise _ct_refuse(f"config_groups.{name}.weights.dynamic", "true")
    scale_dtype = str(weights.get("scale_dtype") or "").removeprefix("torch.")
    if scale_dtype and scale_dtype not in _CT_DTYPE_BYTES:
        raise _ct_refuse(f"config_groups.{name}.weights.scale_dtype", repr(scale_dtype))
    inputs = group.get("input_activations") or {}
    if not isinstance(inputs, Mapping):
        raise _ct_refuse(f"config_groups.{name}.input_activations", repr(inputs))
    static = bool(inputs) and not inputs.get("dynamic", False)
    if static and inputs.get("strategy", "tensor") != "tensor":
        raise _ct_refuse(
            f"config_groups.{name}.input_activations.strategy", repr(inputs["strategy"])
        )
    kind = "fp8_tensor" if strategy == "tensor" else "fp8_channel"
    scale = _CT_DTYPE_BYTES.get(scale_dtype, dtype_bytes)
    return WeightFormat(kind, scale_bytes=scale, input_scale=static)


def _compressed_tensors(raw: Mapping[str, Any], dtype_bytes: int) -> Quantization:
    if raw.get("kv_cache_scheme"):
        raise _ct_refuse("kv_cache_scheme", "set (its k/v scales are not modelled)")
    groups = raw.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise InvalidInputError(f"{_KEY}.config_groups must be a non-empty object, got {groups!r}")
    parsed = []
    for name, group in groups.items():
        targets = group.get("targets") if isinstance(group, Mapping) else None
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise InvalidInputError(f"{_KEY}.config_groups.{name}.targets must list names")
        parsed.append((tuple(targets), _ct_format(name, group, raw.get("format"), dtype_bytes)))
    quant = Quantization(
        "compressed-tensors", tuple(parsed), skip=_names(raw, "ignore"), skip_match="pattern"
    )
    lm_head = quant.format_for("lm_head") is not None
    return Quantization(quant.method, quant.groups, quant.skip, quant.skip_match, lm_head=lm_head)


_PARSERS: dict[str, Callable[[Mapping[str, Any], int], Quantization]] = {
    "awq": _awq,
    "compressed-tensors": _compressed_tensors,
    "fp8": _fp8,
    "gptq": _gptq,
}
