"""Meta kernels that remember: the shapes an op returned for inputs of the same shapes, without working them out
again.

On the meta device, torch computes many ops' output shapes with Python reference implementations (layer norm
and its backward: 2 to 4 ms a call on these cores; gelu, sums, additions: 0.1 to 3 ms); a training step at scale
calls the same few ops with the same shapes millions of times. Inside `remembered_meta_kernels()`, each op of
MEMOIZED answers a call it has seen before (the same shapes, strides, dtypes and other arguments) with fresh
empty tensors of the shapes its own kernel returned the first time. Only functional ops are listed (no in-place
or out= variants, no views: each returns new tensors, never an input), so a remembered answer is the same answer.

This changes torch's dispatcher for the meta device while it is active, for the whole process (registrations
are global): `python -m grader predict` runs with it; grading never does.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
# The first call of some meta kernels in a process imports torch._dynamo (800 modules), and the import leaves
# reference cycles that hold the call's tensors until the garbage collector runs: the ledger saw the first run of a
# process hold more (2 GiB of Llama 8B's keys and values) than every later run. Imported with this module, first.
import torch._dynamo  # noqa: F401,E402

_aten = torch.ops.aten

MEMOIZED = tuple(op for op in (
    _aten.native_layer_norm.default, _aten.native_layer_norm_backward.default, _aten.gelu.default,
    _aten.gelu_backward.default, _aten.add.Tensor, _aten.mul.Tensor, _aten.mul.Scalar, _aten.sub.Tensor,
    _aten.div.Tensor, _aten.sum.dim_IntList, _aten.addmm.default, _aten.mm.default, _aten.bmm.default,
    _aten.baddbmm.default, _aten.cat.default, _aten._softmax.default, _aten._softmax_backward_data.default,
    _aten.native_dropout.default, _aten.native_dropout_backward.default, _aten.masked_fill.Scalar,
    _aten.masked_fill.Tensor, _aten.where.self, _aten.silu.default, _aten.silu_backward.default,
    _aten.embedding.default, _aten.embedding_dense_backward.default, _aten._to_copy.default,
    _aten.clone.default, _aten.lt.Scalar, _aten.ge.Scalar, _aten.bitwise_or.Tensor, _aten.pow.Tensor_Scalar,
    _aten.mean.dim, _aten.rsqrt.default, _aten.neg.default, _aten.exp.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_flash_attention_backward.default) if op is not None)
# out= variants: their answer is `out` itself, checked against what the kernel returned the first time.
MEMOIZED_OUT = tuple(op for op in (_aten.addmm.out, getattr(_aten.addmm, "dtype_out", None)) if op is not None)


def _key(x):
    if isinstance(x, torch.Tensor):
        if x.layout is not torch.strided:
            raise TypeError("not a strided tensor")
        return (x.shape, x.stride(), x.dtype, x.device.type)
    if isinstance(x, (list, tuple)):
        return tuple(_key(v) for v in x)
    hash(x)  # an unhashable argument (a list inside a dict...) is passed on to the kernel itself
    return x


def _shape_of(out):
    if isinstance(out, torch.Tensor):
        return ("tensor", tuple(out.shape), out.stride(), out.dtype)
    if isinstance(out, (list, tuple)):
        return ("seq", type(out), tuple(_shape_of(o) for o in out))
    return ("value", out)


def _made(shape):
    kind = shape[0]
    if kind == "tensor":
        return torch.empty_strided(shape[1], shape[2], dtype=shape[3], device="meta")
    if kind == "seq":  # several returns: the dispatcher takes a plain tuple (or the list a kernel returned)
        made = [_made(s) for s in shape[2]]
        return made if shape[1] is list else tuple(made)
    return shape[1]


class _RememberingOut:
    """The meta kernel of an out= op: once a kind of call has run the kernel itself, it returns `out` again."""

    def __init__(self, op, kernel):
        self.op, self.kernel, self.seen = op, kernel, set()
        self.calls = self.misses = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        out = kwargs.get("out")
        try:
            key = (_key(args), _key(tuple(sorted(kwargs.items()))))
        except TypeError:
            return self.kernel(*args, **kwargs)
        if key in self.seen:
            return out
        self.misses += 1
        result = self.kernel(*args, **kwargs)
        if result is out and _shape_of(result) == _key_shape(out):
            self.seen.add(key)
        return result


def _key_shape(t):
    return ("tensor", tuple(t.shape), t.stride(), t.dtype)


class _Remembering:
    """The meta kernel of one op, remembering what it returned for each kind of call."""

    def __init__(self, op, kernel):
        self.op, self.kernel, self.seen = op, kernel, {}
        self.calls = self.misses = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        try:
            key = (_key(args), _key(tuple(sorted(kwargs.items()))))
        except TypeError:
            return self.kernel(*args, **kwargs)
        shape = self.seen.get(key)
        if shape is None:
            self.misses += 1
            out = self.kernel(*args, **kwargs)
            self.seen[key] = _shape_of(out)
            return out
        return _made(shape)


def _functional(op) -> bool:
    """No in-place or out= variant, no view, and a kernel of its own (not a decomposition into other ops)."""
    return (not op._schema.is_mutable and all(r.alias_info is None for r in op._schema.returns)
            and not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"))


@contextlib.contextmanager
def remembered_meta_kernels():
    """Within: the ops of MEMOIZED remember their meta outputs (module docstring). Yields {op: its kernel}."""
    import torch._meta_registrations  # noqa: F401  torch's Python meta kernels, registered on import

    lib = torch.library.Library("aten", "IMPL")
    installed = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": that is the point
            for op in MEMOIZED:
                kernel = op.py_kernels.get(torch._C.DispatchKey.Meta)
                if kernel is None or not _functional(op):
                    continue
                installed[op] = _Remembering(op, kernel)
                lib.impl(op, installed[op], "Meta")
            for op in MEMOIZED_OUT:
                kernel = op.py_kernels.get(torch._C.DispatchKey.Meta)
                if kernel is not None:
                    installed[op] = _RememberingOut(op, kernel)
                    lib.impl(op, installed[op], "Meta")
        yield installed
    finally:
        lib._destroy()
