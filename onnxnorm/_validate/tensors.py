"""A tensor holds what its shape declares: the bytes it needs, its inline data counted without
allocating, its external-data entry read as integers, and its bytes at hand for a comparison."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from onnx import TensorProto, external_data_helper, helper

from onnxnorm._validate.repairs import ModelProblem

_FOUR_BIT = {
    getattr(TensorProto, name)
    for name in ("INT4", "UINT4", "FLOAT4E2M1")
    if hasattr(TensorProto, name)
}

#: the typed field that holds a tensor's values when it has no raw_data
_TYPED_FIELD: dict[int, str] = {
    TensorProto.FLOAT: "float_data",
    TensorProto.DOUBLE: "double_data",
    TensorProto.INT64: "int64_data",
    TensorProto.UINT32: "uint64_data",
    TensorProto.UINT64: "uint64_data",
    **dict.fromkeys(
        (
            TensorProto.INT32,
            TensorProto.INT16,
            TensorProto.INT8,
            TensorProto.UINT16,
            TensorProto.UINT8,
            TensorProto.BOOL,
            TensorProto.FLOAT16,
            TensorProto.BFLOAT16,
        ),
        "int32_data",
    ),
}


def elements(tensor: TensorProto) -> int:
    if any(d < 0 for d in tensor.dims):
        raise ModelProblem(f"tensor {tensor.name!r} has a negative dimension {list(tensor.dims)}")
    return math.prod(tensor.dims)


def expected_bytes(tensor: TensorProto) -> int | None:
    """The bytes the raw data of ``tensor`` must have; None for strings and unknown types."""
    count = elements(tensor)
    if tensor.data_type in _FOUR_BIT:
        return (count + 1) // 2
    if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return None
    try:
        return count * np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None


def external_info(tensor: TensorProto) -> tuple[str, int, int | None]:
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location", "")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise ModelProblem(
            f"tensor {tensor.name!r}: external data offset/length are not "
            f"integers ({info.get('offset')!r}, {info.get('length')!r})"
        ) from None
    if offset < 0 or (length is not None and length < 0):
        raise ModelProblem(f"tensor {tensor.name!r}: negative external data offset or length")
    return location, offset, length


def check_inline(tensor: TensorProto) -> None:
    """Inline data of the size the shape declares (checked on counts, nothing allocated)."""
    expected = expected_bytes(tensor)
    count = elements(tensor)
    if tensor.HasField("raw_data"):
        if expected is not None and len(tensor.raw_data) != expected:
            raise ModelProblem(
                f"tensor {tensor.name!r} of shape {list(tensor.dims)} needs "
                f"{expected} bytes, it holds {len(tensor.raw_data)}"
            )
        return
    field = _TYPED_FIELD.get(tensor.data_type)
    if field is not None and tensor.data_type not in _FOUR_BIT:
        held = len(getattr(tensor, field))
        if held != count:
            raise ModelProblem(
                f"tensor {tensor.name!r} of shape {list(tensor.dims)} declares "
                f"{count} elements, it holds {held}"
            )


def tensor_bytes(tensor: TensorProto, folder: Path | None) -> tuple | None:
    """(type, dims, bytes) of a tensor, to compare two producers of one name; None when its
    bytes are not at hand (external data without a folder, or over 64 MiB)."""
    if external_data_helper.uses_external_data(tensor):
        if folder is None:
            return None
        location, offset, length = external_info(tensor)
        expected = expected_bytes(tensor)
        length = length if length is not None else expected
        if length is None or length > 1 << 26:
            return None
        try:
            with open(Path(folder) / location, "rb") as f:
                f.seek(offset)
                data = f.read(length)
        except OSError:
            return None
        return tensor.data_type, tuple(tensor.dims), data
    from onnx import numpy_helper

    try:
        array = numpy_helper.to_array(tensor)
    except Exception:  # noqa: BLE001 - a tensor numpy cannot take: compare its fields
        copy = TensorProto()
        copy.CopyFrom(tensor)
        copy.name = ""
        return tensor.data_type, tuple(tensor.dims), copy.SerializeToString()
    return tensor.data_type, tuple(tensor.dims), array.tobytes()
