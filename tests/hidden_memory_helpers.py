"""Rank programs for tests/test_hidden_memory.py, one per kind of tensor whose bytes are not in a storage of its
own, or whose storage changes size where no op shows it. They live in a module of their own, importable by name,
because each process of a real group imports the function it runs.

`keep(dist, kind)` makes a [64, 64] float64 tensor's worth of data in that form and keeps it in a global, so that
it is alive when the rank returns and its ledger closes: the ledger's `current` is then what the kept form costs.
"""

import torch

N = 64
KEPT: list = []


class Hider(torch.Tensor):
    """A wrapper subclass with a __torch_dispatch__ of its own: the ops it runs on its inner tensor are not the
    rank's ops, so no ledger sees what they make."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda a: a.inner if isinstance(a, Hider) else a  # noqa: E731
        out = func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})
        return Hider(out) if isinstance(out, torch.Tensor) else out


def grown(nbytes: int) -> torch.Tensor:
    """A one-number tensor whose storage is then grown to `nbytes` by the storage's own resize_ (no op)."""
    t = torch.zeros(1, dtype=torch.float64)
    t.untyped_storage().resize_(nbytes)
    return t


MAKERS = {
    # charged: the bytes of the storages that hold them
    "sparse COO": lambda x: x.to_sparse(),
    "sparse CSR": lambda x: x.to_sparse_csr(),
    "sparse CSC": lambda x: x.to_sparse_csc(),
    "sparse BSR": lambda x: x.to_sparse_bsr((8, 8)),
    "sparse BSC": lambda x: x.to_sparse_bsc((8, 8)),
    "quantized": lambda x: torch.quantize_per_tensor(x.float(), 0.1, 0, torch.qint8),
    "meta": lambda x: torch.empty(N, N, dtype=torch.float64, device="meta"),
    "nested": lambda x: torch.nested.nested_tensor([x, x]),
    "tensor resize_": lambda x: torch.empty(0, dtype=torch.float64).resize_(N, N).copy_(x),
    "storage resize_ then set_": lambda x: (lambda t: t.set_(t.untyped_storage(), 0, (N, N)).copy_(x))(
        grown(x.nbytes)),
    "a storage made directly": lambda x: torch.empty(0, dtype=torch.float64).set_(
        torch.UntypedStorage(x.nbytes), 0, (N, N)).copy_(x),
    "storage resize_ as the last thing": lambda x: grown(x.nbytes),
    # refused: HiddenMemoryError
    "jagged nested": lambda x: torch.nested.nested_tensor([x, x[:3]], layout=torch.jagged) * 2,
    "mkldnn": lambda x: x.float().to_mkldnn(),
    "subclass": lambda x: Hider(x.clone()) * 2,
}
# The least each charged kind costs, in bytes: its indices (int64) and values (float64) for a [64, 64] tensor with
# no zero. (torch's CSR keeps its column indices in the storage of the COO indices it came from: 2·64·64·8 bytes.)
INDEX, VALUE = 8, 8
CHARGED = {
    "sparse COO": N * N * (2 * INDEX + VALUE),
    "sparse CSR": (N + 1) * INDEX + N * N * (INDEX + VALUE),
    "sparse CSC": (N + 1) * INDEX + N * N * (INDEX + VALUE),
    "sparse BSR": (N // 8 + 1) * INDEX + (N // 8) ** 2 * INDEX + N * N * VALUE,
    "sparse BSC": (N // 8 + 1) * INDEX + (N // 8) ** 2 * INDEX + N * N * VALUE,
    "quantized": N * N,
    "meta": N * N * VALUE,
    "nested": 2 * N * N * VALUE,
    "tensor resize_": N * N * VALUE,
    "storage resize_ then set_": N * N * VALUE,
    "a storage made directly": N * N * VALUE,
    "storage resize_ as the last thing": N * N * VALUE,
}
REFUSED = [k for k in MAKERS if k not in CHARGED]


def keep(dist, kind):
    KEPT.clear()
    x = torch.randn(N, N, dtype=torch.float64) + 100  # no zero: every entry is stored
    KEPT.append(MAKERS[kind](x))
    return {}
