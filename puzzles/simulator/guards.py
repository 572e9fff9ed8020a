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

import sys
import threading

import torch
import torch.utils.dlpack

from . import allowed, escapes
from .types import HiddenMemoryError, _desc

SMALL = 64  # numbers a rank may turn into Python data at once
ITEMS = 4096  # numbers a rank may take out of torch in a run, all ways together (.item(), tolist(), numpy(), ...)
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
    (torch.storage.TypedStorage, "__reduce__", "pickled bytes"),
    (torch.storage.TypedStorage, "tolist", "a Python list"),
]
# (class, method): the ways to a tensor's or a storage's address. With one (and ctypes, refused by allowed.py, or
# numpy's __array_interface__) a rank could read another rank's memory: a rank's own code gets an opaque token.
_ADDRESSES = [(torch.Tensor, "data_ptr"), (torch.UntypedStorage, "data_ptr"),
              (torch.storage.TypedStorage, "data_ptr"), (torch.storage.TypedStorage, "_data_ptr")]
# (module, name, what it makes): functions that take a tensor's contents out of torch (counted as _WAYS are)
_FUNCTIONS = [(torch.utils.dlpack, "to_dlpack", "a DLPack capsule"), (torch._C, "_to_dlpack", "a DLPack capsule")]
# (module, name): functions that hand back a tensor torch made outside any op the mode sees: the rank's own
_MAKERS = [(torch, "get_rng_state"), (torch.random, "get_rng_state")]
_lock = threading.Lock()
_users = 0
_saved: list[tuple] = []  # (class, name, the original if the class itself defined it, else None)
_saved_functions: list[tuple] = []  # (module, name, the original)
_current = []  # the callables that say which rank (if any) is calling: one per active run


def _size(obj) -> int:
    return obj.numel() if isinstance(obj, torch.Tensor) else obj.nbytes() if hasattr(obj, "nbytes") else obj.size()


def _describe(obj) -> str:
    return f"a {_desc(obj)} tensor" if isinstance(obj, torch.Tensor) else f"a storage of {_size(obj):,} bytes"


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
        if who is not None and not (name in _PICKLING and getattr(who, "writes_files", False)):
            count_out(who, self, what)
        return original(self, *args, **kwargs)

    guard.__name__, guard.__qualname__ = name, f"{cls.__name__}.{name}"
    return guard


def count_out(who, obj, what: str) -> None:
    """A rank takes `obj`'s numbers out of torch as `what`: fine for a few at once (SMALL), and for a few thousand
    in all (ITEMS, a running total per rank and run, with .item()'s), so that a tensor copied out in small chunks
    is refused as surely as one copied out at once."""
    n = _size(obj)
    if n > SMALL:
        raise HiddenMemoryError(
            f"rank {who.rank} turned {_describe(obj)} into {what} at {who.site()}: inside a rank, keep tensors "
            f"as torch tensors. The memory ledger sees only torch's storages, so {what} would hide memory "
            f"from the budgets. (Small conversions, up to {SMALL} numbers at once, such as split sizes, a "
            f"count or a logged loss, are fine.)")
    who.items_read += n
    if who.items_read > ITEMS:
        raise HiddenMemoryError(
            f"rank {who.rank} took more than {ITEMS:,} numbers out of tensors in all (as {what}, .item(), "
            f"tolist(), numpy(), ...), the last at {who.site()}: inside a rank, keep tensors as torch tensors. "
            f"Python numbers are memory the ledger cannot see, so copying a tensor out in small pieces would hide "
            f"it from the budgets just as copying it at once would.")


def count_item(who) -> None:
    """A rank read one number out of a tensor (`.item()`, `float(t)`): fine, unless it reads a tensor's worth
    (with what it took out in other ways: count_out's running total)."""
    who.items_read += 1
    if who.items_read > ITEMS:
        raise HiddenMemoryError(
            f"rank {who.rank} took more than {ITEMS:,} numbers out of tensors in all (.item(), float(t), "
            f"int(t), tolist(), numpy(), ...), the last at {who.site()}: inside a rank, keep tensors as torch "
            f"tensors. Python numbers are memory the ledger cannot see, so copying a tensor into them would hide "
            f"it from the budgets.")


_ADDRESS_BASE, _ADDRESS_STRIDE = 1 << 47, 1 << 36  # (tokens above user space: no mapped memory there on Linux)
_tokens: dict = {}  # a storage's real address -> its token, for the run


def _address(cls, name: str, original):
    """data_ptr() from a rank's own code: an opaque number, not the address. Equal for the same storage and offset
    (what honest code compares: is this the buffer I saved?), but no address to hand to ctypes, numpy's
    __array_interface__ or anything else that reads memory where the ledger and the isolation check do not look."""
    def guard(self, *args, **kwargs):
        real = original(self, *args, **kwargs)
        who = _caller()
        if who is None or escapes.rank_calling(sys._getframe(1).f_code) is None or not real:
            return real
        base = (self.untyped_storage() if isinstance(self, torch.Tensor) else self)
        base_ptr = base.data_ptr.__wrapped__(base) if hasattr(base.data_ptr, "__wrapped__") else real
        token = _tokens.setdefault(base_ptr, _ADDRESS_BASE + len(_tokens) * _ADDRESS_STRIDE)
        return token + (real - base_ptr)

    guard.__name__, guard.__qualname__ = name, f"{cls.__name__}.{name}"
    guard.__wrapped__ = original
    return guard


def _counted_function(name: str, what: str, original):
    def guard(obj, *args, **kwargs):
        who = _caller()
        if who is not None and isinstance(obj, torch.Tensor):
            count_out(who, obj, what)
        return original(obj, *args, **kwargs)

    guard.__name__ = guard.__qualname__ = name
    return guard


def _owned(name: str, original):
    def made(*args, **kwargs):
        out = original(*args, **kwargs)
        who = _caller()
        if who is not None and isinstance(out, torch.Tensor) and hasattr(who, "adopt_storage"):
            who.adopt_storage(out.untyped_storage())  # (torch made it without an op: the rank's own memory)
        return out

    made.__name__ = made.__qualname__ = name
    return made


# torch.Generator's get_state() is a C method of a type that cannot be changed (torch._C.Generator), and the state it
# hands back is made outside any op the mode sees: read as a tensor of no rank, the first op on it (a clone, to save
# it) was an IsolationError. So while a run is on, `torch.Generator` is a subclass whose get_state() hands its rank
# the state as the rank's own memory, as torch.get_rng_state's guard does; isinstance and issubclass against it
# hold for every generator (the default one, those made before the run), as they do against torch's own class.
_Generator = torch._C.Generator


class _EveryGenerator(type(_Generator)):
    def __instancecheck__(cls, instance):
        return isinstance(instance, _Generator)

    def __subclasscheck__(cls, subclass):
        return issubclass(subclass, _Generator)


class Generator(_Generator, metaclass=_EveryGenerator):
    """torch.Generator inside a simulated rank: the same generator, whose get_state() is the rank's own memory."""

    __module__ = "torch"  # (what the learner's code reads of it: torch's class)

    def get_state(self):
        state = _Generator.get_state(self)
        who = _caller()
        if who is not None and hasattr(who, "adopt_storage"):
            who.adopt_storage(state.untyped_storage())
        return state


def _counted_getitem(original):
    def getitem(self, index):
        who = _caller()
        if who is not None and isinstance(index, int):
            count_item(who)
        return original(self, index)

    return getitem


def install(current, threads_allowed: bool = False) -> None:
    """Guard the ways out of torch while a run is on. `current()` returns the calling rank (an object with
    `.rank`, `.site()` and `.items_read`) or None for code that is not a rank's own. `threads_allowed` leaves
    allowed.py's rules for threads, processes and the import list out (the differential corpus on gloo:
    torch.distributed's own semantics)."""
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
        for cls, name in _ADDRESSES:
            if hasattr(cls, name):
                own = vars(cls).get(name)
                _saved.append((cls, name, own))
                setattr(cls, name, _address(cls, name, getattr(cls, name)))
        for module, name, what in _FUNCTIONS:
            original = getattr(module, name)
            _saved_functions.append((module, name, original))
            setattr(module, name, _counted_function(name, what, original))
        for module, name in _MAKERS:
            original = getattr(module, name)
            _saved_functions.append((module, name, original))
            setattr(module, name, _owned(name, original))
        _saved_functions.append((torch, "Generator", torch.Generator))
        torch.Generator = Generator
        own = vars(torch.storage._StorageBase).get("__getitem__")
        _saved.append((torch.storage._StorageBase, "__getitem__", own))
        torch.storage._StorageBase.__getitem__ = _counted_getitem(own)
        escapes.install(_caller)
        if not threads_allowed:  # (only the real backend's FunctionTask for the differential corpus asks)
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
        for module, name, original in reversed(_saved_functions):
            setattr(module, name, original)
        _saved_functions.clear()
        _tokens.clear()
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

