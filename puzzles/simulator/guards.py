"""Memory the ledger cannot see: inside a simulated rank, tensors stay tensors.

The memory ledger (memory.py) counts torch's storages. A rank that copied its activations into a numpy array, a
Python list or a bytes object would hold them where no ledger looks, and every memory budget would be
meaningless. None of the puzzles needs such copies, so while a run is on, a rank that makes one gets a
HiddenMemoryError naming its line. Small conversions stay fine: up to SMALL numbers at once (split sizes, a
count, a logged loss), and up to ITEMS numbers read one by one with `.item()`, `float(t)` or `int(t)` per rank.
The same goes for tensors made at module level when a rank imports the learner's file: more than IMPORT_BYTES of
them is a HiddenMemoryError (check_import), since the memory checks measure from the call of the function on.

A rank that mounted a checkpoint disk (filesystem.py) may pickle tensors: torch.save's bytes go to the disk, which
counts every byte to the rank that writes it (`allow_files`).
Every tensor an op makes or takes is charged for the storages that hold its bytes (storages_of): a strided tensor's
own (quantized, meta and nested ones included), a sparse tensor's indices and values (COO, CSR, CSC, BSR, BSC).
A tensor whose bytes no storage shows (a subclass with a `__torch_dispatch__` of its own, whose ops run where no
ledger looks; an mkldnn tensor; a layout torch adds later) is refused with a HiddenMemoryError.

The other ways out are refused by escapes.py (torch's dispatch modes switched off, files written, memory mapped)
and allowed.py (threads and processes started), installed and removed with these guards. allowed.py states the
whole policy.

Outside the ranks (the grader, a notebook cell) nothing changes: the guard asks `current()` who is calling, and
lets everyone but a rank's own code through. The methods are patched on torch's classes only while a run is on.
"""

from __future__ import annotations

import threading

import torch

from . import allowed, escapes
from .types import HiddenMemoryError, _desc

SMALL = 64  # numbers a rank may turn into Python data at once
ITEMS = 4096  # numbers a rank may read one at a time (.item(), float(t), storage[i]) in a run
IMPORT_BYTES = 1024  # bytes of tensors a rank's copy of the learner's file may make at import (a mask, constants)

# (class, method, what it makes): the ways a tensor's or a storage's contents leave torch.
_WAYS = [
    (torch.Tensor, "numpy", "a numpy array"),
    (torch.Tensor, "__array__", "a numpy array"),
    (torch.Tensor, "tolist", "a Python list"),
    (torch.Tensor, "__reduce_ex__", "pickled bytes"),
    (torch.Tensor, "__dlpack__", "a DLPack capsule"),
    (torch.storage._StorageBase, "tolist", "a Python list"),
    (torch.storage._StorageBase, "__iter__", "Python numbers"),
    (torch.storage._StorageBase, "__reduce__", "pickled bytes"),
]
_lock = threading.Lock()
_users = 0
_saved: list[tuple] = []  # (class, name, the original if the class itself defined it, else None)
_current = []  # the callables that say which rank (if any) is calling: one per active run


def _size(obj) -> int:
    return obj.numel() if isinstance(obj, torch.Tensor) else obj.nbytes()


def _describe(obj) -> str:
    return f"a {_desc(obj)} tensor" if isinstance(obj, torch.Tensor) else f"a storage of {obj.nbytes():,} bytes"


def _caller():
    for current in list(_current):
        who = current()
        if who is not None:
            return who
    return None


_PICKLING = ("__reduce_ex__", "__reduce__")


def caller():
    """The rank whose own code is running in this thread (the simulator's rank state, or a real process's tracker:
    each has .rank, .clock, .labels and .site()), or None."""
    return _caller()


def allow_files() -> None:
    """The calling rank writes files (it mounted a checkpoint disk): torch.save may pickle its tensors."""
    who = _caller()
    if who is not None:
        who.writes_files = True


def _guarded(cls, name: str, what: str, original):
    def guard(self, *args, **kwargs):
        who = _caller()
        if who is not None and _size(self) > SMALL and not (name in _PICKLING and getattr(who, "writes_files", False)):
            raise HiddenMemoryError(
                f"rank {who.rank} turned {_describe(self)} into {what} at {who.site()}: inside a rank, keep tensors "
                f"as torch tensors. The memory ledger sees only torch's storages, so {what} would hide memory "
                f"from the budgets. (Small conversions, up to {SMALL} numbers at once, such as split sizes, a "
                f"count or a logged loss, are fine.)")
        return original(self, *args, **kwargs)

    guard.__name__, guard.__qualname__ = name, f"{cls.__name__}.{name}"
    return guard


def count_item(who) -> None:
    """A rank read one number out of a tensor (`.item()`, `float(t)`): fine, unless it reads a tensor's worth."""
    who.items_read += 1
    if who.items_read > ITEMS:
        raise HiddenMemoryError(
            f"rank {who.rank} read more than {ITEMS:,} numbers out of tensors one by one (.item(), float(t), "
            f"int(t)), the last at {who.site()}: inside a rank, keep tensors as torch tensors. Python numbers are "
            f"memory the ledger cannot see, so copying a tensor into them would hide it from the budgets.")


def _counted_getitem(original):
    def getitem(self, index):
        who = _caller()
        if who is not None and isinstance(index, int):
            count_item(who)
        return original(self, index)

    return getitem


def install(current) -> None:
    """Guard the ways out of torch while a run is on. `current()` returns the calling rank (an object with
    `.rank`, `.site()` and `.items_read`) or None for code that is not a rank's own."""
    global _users
    with _lock:
        _current.append(current)
        _users += 1
        if _users > 1:
            return
        for cls, name, what in _WAYS:
            own = vars(cls).get(name)
            _saved.append((cls, name, own))
            setattr(cls, name, _guarded(cls, name, what, getattr(cls, name)))
        own = vars(torch.storage._StorageBase).get("__getitem__")
        _saved.append((torch.storage._StorageBase, "__getitem__", own))
        torch.storage._StorageBase.__getitem__ = _counted_getitem(own)
        escapes.install(_caller)
        allowed.install()


def uninstall(current) -> None:
    global _users
    with _lock:
        _current.remove(current)
        _users -= 1
        if _users:
            return
        allowed.uninstall()
        escapes.uninstall()
        for cls, name, own in reversed(_saved):
            if own is None:
                delattr(cls, name)
            else:
                setattr(cls, name, own)
        _saved.clear()


# A sparse tensor has no storage of its own: its bytes are its parts', which the ledger charges instead.
_SPARSE_PARTS = {
    torch.sparse_coo: ("_indices", "_values"),
    torch.sparse_csr: ("crow_indices", "col_indices", "values"),
    torch.sparse_csc: ("ccol_indices", "row_indices", "values"),
    torch.sparse_bsr: ("crow_indices", "col_indices", "values"),
    torch.sparse_bsc: ("ccol_indices", "row_indices", "values"),
}
_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__


def storages_of(t: torch.Tensor, who) -> tuple:
    """The storages that hold `t`'s bytes, for the ledger to charge and the isolation check to read. `who` (with
    `.rank` and `.site()`) is the rank whose op made or took `t`: a tensor whose bytes no storage shows is refused
    with a HiddenMemoryError naming it. Call it where no dispatch mode is active (inside __torch_dispatch__)."""
    cls = type(t)
    if cls is not torch.Tensor and getattr(cls, "__torch_dispatch__", None) is not _PLAIN_DISPATCH:
        _refuse(t, who, f"a tensor of the class {cls.__name__}, whose own __torch_dispatch__ runs its ops where no "
                        f"memory ledger looks")
    layout = t.layout
    if layout is torch.strided:
        try:
            return (t.untyped_storage(),)
        except (RuntimeError, NotImplementedError):
            _refuse(t, who, "a tensor with no storage of its own")
    parts = _SPARSE_PARTS.get(layout)
    if parts is None:
        _refuse(t, who, f"a {str(layout).replace('torch.', '')} tensor")
    return tuple(getattr(t, part)().untyped_storage() for part in parts)


def _refuse(t: torch.Tensor, who, what: str):
    raise HiddenMemoryError(
        f"rank {who.rank} made or used {what} ({_desc(t)}) at {who.site()}: the memory ledger cannot see its "
        f"bytes, so it would hide memory from the budgets. Inside a rank, keep tensors as ordinary torch tensors "
        f"(sparse ones are fine: their indices and values are charged).")


def check_import(rank: int, made: list[tuple[str, int]]) -> None:
    """Refuse a file that made more than IMPORT_BYTES of tensors at import, [(where, bytes)]. The puzzles measure a
    rank's memory from the call of the learner's function on (p1's checkpoints, p8's optimizer state: what the
    rank holds beyond what it held before), so a buffer made at module level would escape those budgets."""
    total = sum(nbytes for _, nbytes in made)
    if total <= IMPORT_BYTES:
        return
    where = "; ".join(f"{site}: {nbytes:,} bytes" for site, nbytes in sorted(made, key=lambda m: -m[1])[:3])
    raise HiddenMemoryError(
        f"rank {rank}'s copy of your file made {total:,} bytes of tensors at import ({where}). The puzzles measure "
        f"a rank's memory from the call of your function on, so a buffer made at module level would escape their "
        f"budgets: make tensors inside your functions (or keep them on the object the puzzle asks for). Up to "
        f"{IMPORT_BYTES:,} bytes at module level (a mask, a few constants) are fine.")

