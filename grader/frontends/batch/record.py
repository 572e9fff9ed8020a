"""A puzzle's record, from the puzzle's process to the batch's parent, without pickle.

    GRADREC1 | length of the header (8 bytes, big-endian) | header (JSON) | the tensors' bytes, one after another

The header holds the structure: JSON's null, booleans, numbers and strings; {"u": [...]} a tuple; {"m": [[k, v],
...]} a dict; {"f": "nan"} a float JSON cannot spell; {"t": i, "dtype": "torch.float64", "shape": [...]} the i-th
tensor; and "sizes", the byte count of every tensor. The parent reads it with `json` and builds each tensor with
`torch.frombuffer` after checking its dtype, its shape and its byte count against the bytes that follow: nothing
in a record can name a class or a function. That is stricter than `torch.load(weights_only=True)`, whose
unpickler had a remote-code-execution bypass before torch 2.6 (CVE-2025-32434) and memory corruption before 2.10
(CVE-2026-24747); this project supports torch 2.2 and later.

`dumps` runs in the puzzle's own process, after the learner's code: it runs none of it. Everything it uses was
bound when this module was imported (before any learner's code): JSON's C encoder, `math.isfinite`, torch's
conversions, run with __torch_function__ and dispatch modes switched off. It takes exact plain types only (and
the subclasses of tuple, list, dict, int, float and str through their base type's own methods, never theirs), and
tensors of the classes torch.Tensor and nn.Parameter: a learner's class (a dict whose items() lies, a tensor
subclass) never gets a call.
"""

from __future__ import annotations

import json
import math

import torch

MAGIC = b"GRADREC1"
DTYPES = {str(d): d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex128,
                               torch.complex64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                               torch.bool)}
MAX_ELEMENTS = 1 << 28


def _refuse(x):
    raise TypeError(f"a {type(x).__name__}")


try:  # JSON's C encoder, made now: a learner's later change to json's classes or functions cannot reach it
    _ENCODE = json.encoder.c_make_encoder(None, _refuse, json.encoder.encode_basestring_ascii, None, ": ", ", ",
                                          False, False, False)
except (AttributeError, TypeError):  # a Python without json's C speedups: the fingerprint watches json instead
    _ENCODE = None
_json_dumps, _isfinite, _float_repr, _join = json.dumps, math.isfinite, float.__repr__, "".join
_no_function, _no_dispatch = torch._C.DisableTorchFunction, torch._C._DisableTorchDispatch
_TENSORS = (torch.Tensor, torch.nn.Parameter)
_tuple_iter, _list_iter, _dict_items, _int, _str = tuple.__iter__, list.__iter__, dict.items, int.__int__, str.__str__
_uint8, _cpu = torch.uint8, torch.device("cpu")


def _tensor_bytes(x: torch.Tensor) -> tuple[bytes, str, list]:
    with _no_function(), _no_dispatch():
        t = torch.Tensor.contiguous(torch.Tensor.to(torch.Tensor.detach(x), _cpu))
        if str(t.dtype) not in DTYPES:
            raise TypeError(f"a tensor of {t.dtype}")
        # copied without numpy: torch 2.2's numpy bridge fails under numpy 2
        raw = bytearray(t.numel() * t.element_size())
        if raw:
            flat = torch.Tensor.view(torch.Tensor.reshape(t, (-1,)), _uint8)
            torch.Tensor.copy_(torch.frombuffer(raw, dtype=_uint8), flat)
        raw = bytes(raw)
        return raw, str(t.dtype), [_int(n) for n in _tuple_iter(t.shape)]


def dumps(value) -> bytes:
    """The record's bytes; TypeError for anything but plain data and tensors (a lambda, a module, a lock...)."""
    blobs: list[bytes] = []

    def encode(x):
        kind = type(x)
        if x is None or kind is bool:
            return x
        if issubclass(kind, int):
            return _int(x)
        if issubclass(kind, float):
            x = float(_float_repr(x)) if kind is not float else x
            return x if _isfinite(x) else {"f": _float_repr(x)}
        if issubclass(kind, str):
            return _str(x)
        if kind in _TENSORS:
            raw, dtype, shape = _tensor_bytes(x)
            blobs.append(raw)
            return {"t": len(blobs) - 1, "dtype": dtype, "shape": shape}
        if issubclass(kind, tuple):  # torch.Size included
            return {"u": [encode(v) for v in _tuple_iter(x)]}
        if issubclass(kind, list):
            return [encode(v) for v in _list_iter(x)]
        if issubclass(kind, dict):
            return {"m": [[encode(k), encode(v)] for k, v in _dict_items(x)]}
        raise TypeError(f"a {kind.__name__}")

    head = {"value": encode(value), "sizes": [len(b) for b in blobs]}
    text = _join(_ENCODE(head, 0)) if _ENCODE is not None else _json_dumps(head, allow_nan=False)
    header = text.encode()
    return MAGIC + len(header).to_bytes(8, "big") + header + _join_bytes(blobs)


_join_bytes = b"".join


class RecordError(ValueError):
    """The bytes are not a record (the message says where they are not)."""


def loads(data: bytes):
    if data[:8] != MAGIC or len(data) < 16:
        raise RecordError("not a record")
    size = int.from_bytes(data[8:16], "big")
    try:
        header = json.loads(data[16:16 + size], parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise RecordError(f"a header that is not JSON ({type(exc).__name__})") from None
    sizes = header.get("sizes") if isinstance(header, dict) else None
    if not isinstance(sizes, list) or not all(type(s) is int and s >= 0 for s in sizes):
        raise RecordError("no tensor sizes")
    starts = [16 + size]
    for s in sizes:
        starts.append(starts[-1] + s)
    if starts[-1] != len(data):
        raise RecordError(f"{len(data) - starts[-1]:+d} bytes beyond what the header declares")

    def tensor(node: dict) -> torch.Tensor:
        i, dtype, shape = node.get("t"), DTYPES.get(node.get("dtype")), node.get("shape")
        if type(i) is not int or not 0 <= i < len(sizes) or dtype is None or not isinstance(shape, list) \
                or not all(type(n) is int and 0 <= n <= MAX_ELEMENTS for n in shape):
            raise RecordError("a malformed tensor")
        count = math.prod(shape)
        if count > MAX_ELEMENTS or count * dtype.itemsize != sizes[i]:
            raise RecordError(f"a tensor whose bytes do not match its shape {shape} and {dtype}")
        if not count:
            return torch.empty(shape, dtype=dtype)
        raw = bytearray(data[starts[i]:starts[i + 1]])
        return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)

    def decode(x):
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [decode(v) for v in x]
        if isinstance(x, dict) and len(x) == 1 and "u" in x and isinstance(x["u"], list):
            return tuple(decode(v) for v in x["u"])
        if isinstance(x, dict) and len(x) == 1 and "m" in x and isinstance(x["m"], list):
            if not all(isinstance(p, list) and len(p) == 2 for p in x["m"]):
                raise RecordError("a malformed dict")
            try:
                return {decode(k): decode(v) for k, v in x["m"]}
            except TypeError:  # a key that cannot be one (a list)
                raise RecordError("a dict key that is not hashable") from None
        if isinstance(x, dict) and set(x) == {"f"} and x["f"] in ("nan", "inf", "-inf"):
            return float(x["f"])
        if isinstance(x, dict) and set(x) == {"t", "dtype", "shape"}:
            return tensor(x)
        raise RecordError("an unknown node")

    try:
        return decode(header.get("value"))
    except RecursionError:
        raise RecordError("nested too deep") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")
