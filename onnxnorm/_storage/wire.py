"""The protobuf wire format of ONNX files, read and written by hand where the protobuf library
would hold every weight in memory: parsing a model with its inline weights left in the file
(:func:`load_weights_as_references`), and appending one initializer streamed from a file
(:func:`write_referenced`).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import onnx
from onnx import TensorProto

from onnxnorm._storage.external import (
    SMALL_TENSOR,
    external_location,
    set_external_location,
    tensor_header,
)
from onnxnorm._storage.filesystem import copy_range

# field numbers of onnx.proto3
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9
#: wire type 2: a length-prefixed field (a message, bytes)
_LENGTH_PREFIXED = 2


def _varint(buf, pos: int) -> tuple[int, int]:
    """The varint at ``buf[pos]`` and the position after it."""
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int) -> bytes:
    """The key of the length-prefixed field ``number``."""
    return bytes([number << 3 | _LENGTH_PREFIXED])


def _fields(buf, start: int, end: int):
    """(field number, wire type, field start, payload start, payload end) of each field of the
    protobuf message in ``buf[start:end]``."""
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, payload_end = _varint(buf, pos)
        elif wire == 1:
            payload_end = pos + 8
        elif wire == _LENGTH_PREFIXED:
            length, pos = _varint(buf, pos)
            payload_end = pos + length
        elif wire == 5:
            payload_end = pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if payload_end > end:
            raise ValueError("truncated protobuf message")
        yield number, wire, field_start, pos, payload_end
        pos = payload_end


def load_weights_as_references(path: Path) -> onnx.ModelProto:
    """Parses ``path`` without copying the raw data of its initializers: each initializer's
    raw data of 1 KiB or more becomes an external-data reference into ``path`` itself (its
    offset in the file), so that the weights are read from disk only when written out."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        rest, graph_rest = bytearray(), bytearray()
        tensors = []
        for number, wire, field_start, start, end in _fields(buf, 0, len(buf)):
            if number != _MODEL_GRAPH or wire != _LENGTH_PREFIXED:
                rest += buf[field_start:end]
                continue
            for g_number, g_wire, g_field, g_start, g_end in _fields(buf, start, end):
                if g_number != _GRAPH_INITIALIZER or g_wire != _LENGTH_PREFIXED:
                    graph_rest += buf[g_field:g_end]
                    continue
                tensors.append(_tensor_as_reference(buf, g_start, g_end, path.name))
    model = onnx.ModelProto.FromString(bytes(rest))
    model.graph.ParseFromString(bytes(graph_rest))
    model.graph.initializer.extend(tensors)
    return model


def _tensor_as_reference(buf, start: int, end: int, location: str) -> TensorProto:
    """The TensorProto in ``buf[start:end]``, its raw data of SMALL_TENSOR bytes or more made an
    external-data reference into the file ``location`` that ``buf`` holds."""
    meta, reference = bytearray(), None
    for number, wire, field_start, data_start, data_end in _fields(buf, start, end):
        if (
            number == _TENSOR_RAW_DATA
            and wire == _LENGTH_PREFIXED
            and data_end - data_start >= SMALL_TENSOR
        ):
            reference = (data_start, data_end - data_start)
        else:
            meta += buf[field_start:data_end]
    tensor = TensorProto.FromString(bytes(meta))
    if reference is not None:
        set_external_location(tensor, location, *reference)
    return tensor


def write_referenced(f, tensor: TensorProto, source_dir: Path) -> None:
    """Appends ``tensor`` to the model being written to ``f`` as one more graph initializer
    with its raw data streamed from its external-data reference: a ModelProto holding a
    GraphProto holding the TensorProto, length prefixes computed, the data copied in chunks."""
    location, start, length = external_location(tensor)
    if length is None:
        length = os.path.getsize(source_dir / location) - start
    raw_header = _key(_TENSOR_RAW_DATA) + _encode_varint(length)
    tensor_head = tensor_header(tensor).SerializeToString() + raw_header
    tensor_len = len(tensor_head) + length
    tensor_field = _key(_GRAPH_INITIALIZER) + _encode_varint(tensor_len)
    graph_len = len(tensor_field) + tensor_len
    f.write(_key(_MODEL_GRAPH) + _encode_varint(graph_len) + tensor_field + tensor_head)
    if copy_range(source_dir / location, start, length, f) != length:
        raise OSError(f"{location} ends before the tensor data it should hold")
