"""What an answer can change in the grading process without rebinding any attribute (tamper.py's fingerprint
sees attributes): hooks that watch every call, torch's thread-local switches, and the dispatcher's kernels.

    Hooks        `sys.setprofile` / `sys.settrace` (this thread) and `threading.setprofile` / `settrace` (threads
                 started later): a hook sees every call of the grader's code with its arguments, and can rewrite a
                 record or an observation as it passes.
    Switches     a TorchDispatchMode or TorchFunctionMode left entered (it would see the comparison's every op and
                 answer for it), grad mode, inference mode, autocast, the default dtype and device, dispatch keys
                 included or excluded for this thread.
    Kernels      every aten operator's registrations (`torch._C._dispatch_dump`): `torch.library` re-registering
                 `aten::max` for CPU makes every max the comparison takes read 0. Measured: 40 ms for all 3,110 aten
                 operators, so a look reads them afresh only when a library was made from Python since the last
                 look (every registration from Python makes one through `torch._C._dispatch_library`, which this
                 module counts), or when asked to (`force`: a batch's puzzle process, where a kernel could also
                 come from a compiled library, reads them once at the end).

Each is read with functions bound when this module is imported, before any learner's code runs, so that an
answer that replaces `sys.setprofile` or `torch._C._dispatch_dump` changes nothing here (and the fingerprint names
the replacement). `ProcessState` takes a look; `changes(later)` says what differs, in words; `restore()` puts the
hooks and switches back and removes the kernels an answer registered through torch.library.
"""

from __future__ import annotations

import os
import sys
import threading
import types

import torch

_getprofile, _gettrace, _setprofile, _settrace = sys.getprofile, sys.gettrace, sys.setprofile, sys.settrace
_thread_setprofile, _thread_settrace = threading.setprofile, threading.settrace
_thread_getprofile = getattr(threading, "getprofile", lambda: getattr(threading, "_profile_hook", None))
_thread_gettrace = getattr(threading, "gettrace", lambda: getattr(threading, "_trace_hook", None))
_C = torch._C
_all_ops, _dump = _C._dispatch_get_all_op_names, _C._dispatch_dump
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep

HOOKS = ("sys.setprofile", "sys.settrace", "threading.setprofile", "threading.settrace")


def hooks() -> tuple:
    """(profile, trace) of this thread, and the ones threading gives the threads it starts."""
    return _getprofile(), _gettrace(), _thread_getprofile(), _thread_gettrace()


def set_hooks(values: tuple) -> None:
    profile, trace, thread_profile, thread_trace = values
    _setprofile(profile)
    _settrace(trace)
    _thread_setprofile(thread_profile)
    _thread_settrace(thread_trace)


def hook_changes(before: tuple, now: tuple) -> list[str]:
    return [f"a hook was installed with {name} (it would see every call of the grader's code)"
            for name, a, b in zip(HOOKS, before, now) if a is not b]


def thread_hooks_changed() -> list[str]:
    """Hooks this thread has that the threads threading starts are not given (a rank's thread that called
    sys.setprofile or sys.settrace); cleared here."""
    found = hook_changes((_thread_getprofile(), _thread_gettrace()), (_getprofile(), _gettrace()))
    if found:
        _setprofile(_thread_getprofile())
        _settrace(_thread_gettrace())
    return [f.replace("threading.", "sys.", 1) if "threading." in f else f for f in found]


def _autocast() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch before 2.4
        return torch.is_autocast_cpu_enabled()


def switches() -> dict:
    """torch's thread-local and global switches that change what an op computes or who sees it."""
    return {
        "dispatch modes entered": _C._len_torch_dispatch_stack(),
        "function modes entered": _C._len_torch_function_stack(),
        "__torch_function__ enabled": _C._is_torch_function_enabled(),
        "grad mode": torch.is_grad_enabled(),
        "inference mode": torch.is_inference_mode_enabled(),
        "autocast": _autocast(),
        "default dtype": torch.get_default_dtype(),
        "default device": str(torch.get_default_device()) if hasattr(torch, "get_default_device") else "cpu",
        "dispatch keys included": str(_C._dispatch_tls_local_include_set()),
        "dispatch keys excluded": str(_C._dispatch_tls_local_exclude_set()),
    }


def set_switches(values: dict) -> None:
    """Put the switches that changed back as they were (modes popped down to the number entered then)."""
    now = switches()
    if now["default device"] != values["default device"] and hasattr(torch, "set_default_device"):
        # (a default device is itself a function mode: none when it is the CPU)
        torch.set_default_device(None if values["default device"] == "cpu" else values["default device"])
    while _C._len_torch_dispatch_stack() > values["dispatch modes entered"]:
        _C._pop_torch_dispatch_stack()
    while _C._len_torch_function_stack() > values["function modes entered"]:
        _C._pop_torch_function_stack()
    if now["grad mode"] != values["grad mode"]:
        torch.set_grad_enabled(values["grad mode"])
    if now["default dtype"] != values["default dtype"]:
        torch.set_default_dtype(values["default dtype"])
    for key in _keys(values["dispatch keys included"]) ^ _keys(str(_C._dispatch_tls_local_include_set())):
        _C._dispatch_tls_set_dispatch_key_included(_C.DispatchKey.__members__[key],
                                                    key in _keys(values["dispatch keys included"]))
    for key in _keys(values["dispatch keys excluded"]) ^ _keys(str(_C._dispatch_tls_local_exclude_set())):
        _C._dispatch_tls_set_dispatch_key_excluded(_C.DispatchKey.__members__[key],
                                                    key in _keys(values["dispatch keys excluded"]))


def _keys(text: str) -> set[str]:
    inner = text[text.find("(") + 1:text.rfind(")")]
    return {k.strip() for k in inner.split(",") if k.strip()}


def _counted(make_library):
    def _dispatch_library(*args, **kwargs):
        _READINGS.libraries_made += 1
        return make_library(*args, **kwargs)

    _dispatch_library.counts_libraries = True
    return _dispatch_library


# The libraries made from Python so far, and the last reading of the kernels with the count it was made at. (A
# namespace, not a list: the fingerprint watches the grader's own lists, and torch makes libraries of its own when
# it imports parts of itself lazily, say at torch.optim's first step.)
_READINGS = types.SimpleNamespace(libraries_made=0, read_at=None, kernels=None)
if not getattr(_C._dispatch_library, "counts_libraries", False):
    _C._dispatch_library = _counted(_C._dispatch_library)


def kernels(force: bool = False) -> dict[str, str]:
    """Every aten operator's registrations, as the dispatcher prints them (the last reading, when no library has
    been made from Python since and `force` is not asked)."""
    if force or _READINGS.read_at != _READINGS.libraries_made:
        _READINGS.read_at = _READINGS.libraries_made
        _READINGS.kernels = {name: _dump(name) for name in _all_ops() if name.startswith("aten::")}
    return _READINGS.kernels


def kernel_changes(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """'aten::max: a CPU kernel registered at p3_data_parallel.py:16' for every registration added, replaced or
    removed since `before` (operators added since are torch's own lazy imports: not looked at)."""
    out = []
    for name, text in before.items():
        later = now.get(name)
        if later == text:
            continue
        old, found = set(text.splitlines()), []
        for line in (later or "").splitlines():
            if line not in old and ": registered at " in line and "(inactive)" not in line:
                key, _, site = line.partition(": registered at ")
                file, _, number = site.split(" :: ")[0].rpartition(":")
                found.append(f"{name}: a {key.strip()} kernel registered at {os.path.basename(file)}:{number}")
        out += found or [f"{name}'s kernels were changed"]
    return out


def remove_registered_kernels() -> None:
    """Destroy the torch.library registrations made since the grader was imported on the aten operators whose
    kernels changed (a Library an answer keeps in a global would keep its kernel for every puzzle graded after it
    in this process). One that cannot be found (made through torch._C directly) stays, and every later look names
    it again: never a pass."""
    import gc

    now = kernels(force=True)
    changed = {name.split("::", 1)[1].split(".")[0] for name, text in BASELINE_KERNELS.items() if now.get(name) != text}
    if not changed or not _LIBRARY:
        return
    for obj in gc.get_objects():
        if issubclass(type(obj), _LIBRARY) and obj not in _TORCH_LIBRARIES and getattr(obj, "m", None) is not None \
                and any(impl.split("/")[1].split(".")[0] in changed for impl in obj._op_impls):
            obj._destroy()
    _READINGS.read_at = None  # (the next look reads the kernels as they are now)


class ProcessState:
    """One look at the hooks and the switches of this thread, and at the kernels of the process (compared with the
    kernels when the grader was imported: a registration that could not be undone is named at every later look)."""

    def __init__(self, with_kernels: bool = True, force: bool = False):
        self.hooks = hooks()
        self.switches = switches()
        self.kernels = kernels(force) if with_kernels else None

    def changes(self, later: ProcessState) -> list[str]:
        out = hook_changes(self.hooks, later.hooks)
        out += [f"torch's {name} changed from {self.switches[name]} to {later.switches[name]}"
                for name in self.switches if later.switches[name] != self.switches[name]]
        if later.kernels is not None:
            out += kernel_changes(BASELINE_KERNELS, later.kernels)
        return out

    def unhook(self) -> list[str]:
        """Clear the hooks installed since this look (this thread's and threading's); say which they were."""
        found = hook_changes(self.hooks, hooks())
        if found:
            set_hooks(self.hooks)
        return found

    def restore(self) -> None:
        set_hooks(self.hooks)
        set_switches(self.switches)
        remove_registered_kernels()


def _libraries() -> tuple:
    import gc
    import weakref

    kind = getattr(getattr(torch, "library", None), "Library", None)
    if kind is None:
        return (), weakref.WeakSet()
    return kind, weakref.WeakSet(o for o in gc.get_objects() if issubclass(type(o), kind))


# Taken when the grader is imported, before any learner's code: the kernels torch registered itself, and its own
# torch.library objects (never destroyed).
BASELINE_KERNELS = kernels(force=True)
_LIBRARY, _TORCH_LIBRARIES = _libraries()
