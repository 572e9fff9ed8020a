"""The other ways out of the ledger and the clock: torch's dispatch modes switched off, files and mapped memory.

Everything a rank computes is seen by one TorchDispatchMode (the simulator's, or the real backend's tracker): that
is how the memory ledger charges every storage and the clock every op. Two doors bypass it, and no puzzle needs
either, so while a run is on, a rank's own code that opens one gets an IsolationError naming its line:

- **Switching the dispatch modes off.** `torch.utils._python_dispatch._disable_current_modes()` and its kin pop
  the mode for a while: ops run there cost nothing and allocate nothing, as far as the grader can tell. torch's own
  code does this legitimately (printing a tensor, calling an op through the Python dispatcher), so only a call made
  straight from a rank's own code is refused: the caller's file is neither torch's nor the grader's nor the
  simulator's. The functions are replaced on their modules only while a run is on (guards.install), so code that
  imported them beforehand (the grader's) keeps the originals.
- **Writing files, mapping memory.** A rank that writes its optimizer state to a file and reads it back at the
  next step holds it where no ledger looks; so does an anonymous mmap. A permanent audit hook (PEP 578: it sees
  `open`, `os.open` and `mmap` from any thread, and cannot be removed) refuses them while a rank's own code runs
  (not while it imports a module: a library may write its caches then). torch.save and torch.load open a path in
  C++, where no audit event is raised, so while a run is on they refuse a path from a rank's own code too (a file
  object, such as the checkpoint disk's, is fine).
  (A thread or a child process could hold data too: allowed.py refuses both.) Reading files stays fine (imports
  read them), and so does the checkpoint disk of puzzle 18 (filesystem.py, or the real backend's disk.py), whose
  calls come through the grader's own code.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.utils._python_dispatch as _python_dispatch

from .types import HiddenMemoryError, IsolationError

# (module, name): the levers that take the dispatch modes off the stack or keep ops from reaching them.
_LEVERS = [(_python_dispatch, n) for n in ("_disable_current_modes", "_pop_mode_temporarily", "_pop_mode")] + [
    (torch._C, n) for n in ("_DisableTorchDispatch", "_ExcludeDispatchKeyGuard", "_pop_torch_dispatch_mode",
                            "_unset_dispatch_mode", "_dispatch_tls_set_dispatch_key_excluded",
                            "_ForceDispatchKeyGuard", "_dispatch_tls_set_dispatch_key_included",
                            "_DisablePythonDispatcher", "_dispatch_call_boxed")] + [
    (torch._ops.OpOverload, "redispatch")]  # (an op sent on past the Python key, where the modes are)
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_HERE = os.path.dirname(os.path.abspath(__file__))
OURS = _OURS = (_HERE + os.sep, os.path.join(os.path.dirname(os.path.dirname(_HERE)), "grader") + os.sep)
# torch, the standard library, installed packages:
PASSING = _PASSING = (_TORCH_DIR, os.path.dirname(os.__file__) + os.sep,
                      os.path.dirname(os.path.dirname(torch.__file__)) + os.sep)
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_saved: list[tuple] = []
_caller = None  # guards.caller, set by install


_MACHINERY = tuple(os.path.join(_HERE, f) for f in ("guards.py", "escapes.py", "allowed.py", "mode.py"))


def runtime_is_calling() -> bool:
    """Whether the code running while a rank's `untracked` flag is on is the runtime's own (moving data, saving
    the random state), not a rank's: the flag is an attribute a rank can reach through its dist, so it is believed
    only when, walking out past the guards' own frames, torch's and the standard library's, the first other frame
    is the simulator's or the grader's."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(_MACHINERY) or frame.f_code.co_name == "guard_caller"):
            if name.startswith(_OURS):
                return True
            if not name.startswith(_PASSING) and not name.startswith("<frozen"):
                return False
        frame = frame.f_back
    return False


def caller():
    """The rank whose own code runs in this thread while a run is on (guards.caller), or None."""
    return _caller() if _caller is not None else None


def rank_calling(code):
    """The rank whose own code (`code`, the caller's) is calling, or None (torch's code and ours are trusted)."""
    return _rank_calling(code)


def _rank_calling(code):
    """The rank whose own code (`code`, the caller's) is calling, or None: torch's and ours are trusted."""
    who = _caller() if _caller is not None else None
    if who is None or code.co_filename.startswith(_TORCH_DIR) or code.co_filename.startswith(_OURS):
        return None
    return who


def _through_ours() -> bool:
    """Whether the call that raised the event came through the grader's or the simulator's code (the checkpoint
    disk's calls) rather than straight from a rank's own: walking out from the event, past torch's, the standard
    library's and installed packages' frames (torch.save, tempfile, numpy.save), which comes first."""
    frame = sys._getframe(3)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_OURS) or name.startswith("<frozen importlib"):
            return True  # (an import: a library may write its caches then, and a rank's import runs once)
        if not name.startswith(_PASSING) and not name.startswith("<frozen"):
            return frame.f_code.co_name == "<module>"  # the rank's own code: refused, unless it is being imported
        frame = frame.f_back
    return False


def _refuse(who, what: str, why: str):
    raise IsolationError(f"rank {who.rank} {what} at {who.site()}: {why} No puzzle needs it.")


def _lever(module, name: str, original):
    def lever(*args, **kwargs):
        who = _rank_calling(sys._getframe(1).f_code)
        if who is not None:
            _refuse(who, f"switched torch's dispatch modes off ({getattr(module, '__name__', module)}.{name})",
                    "ops run there escape the memory ledger, the FLOP count and the clock that grade the puzzle.")
        return original(*args, **kwargs)

    lever.__name__ = lever.__qualname__ = name
    return lever


def _by_file_object(name: str, original):
    def call(obj_or_f, *args, **kwargs):
        f = obj_or_f if name == "load" else (args[0] if args else kwargs.get("f"))
        code = sys._getframe(1).f_code
        who = _rank_calling(code)
        if who is not None and isinstance(f, (str, bytes, os.PathLike)) and code.co_name != "<module>":
            # (as for open(): a module being imported may)
            _refuse(who, f"called torch.{name} on the path {os.fsdecode(f)!r}",
                    "a file holds data where the memory ledger cannot see it.")
        if who is not None and name == "save" and not getattr(who, "writes_files", False):
            # (its pickler takes a storage's bytes by persistent_id, past every tensor's and storage's __reduce__)
            raise HiddenMemoryError(
                f"rank {who.rank} called torch.save at {who.site()} without a checkpoint disk: the bytes it writes "
                f"(to a BytesIO or any file object) hold tensors where the memory ledger cannot see them. Keep "
                f"tensors as tensors; to checkpoint (puzzle 18), save to the disk you mount (disk.mount(dist)), "
                f"which counts every byte.")
        return original(obj_or_f, *args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__wrapped__ = original
    return call


def install(caller) -> None:
    """Guard the levers while a run is on (called once, by guards.install, for the first run of several)."""
    global _caller
    _caller = caller
    for module, name in _LEVERS:
        original = getattr(module, name, None)
        if original is not None:
            _saved.append((module, name, original))
            setattr(module, name, _lever(module, name, original))
    for name in ("save", "load"):
        original = getattr(torch, name)
        _saved.append((torch, name, original))
        setattr(torch, name, _by_file_object(name, original))


def uninstall() -> None:
    global _caller
    for module, name, original in reversed(_saved):
        setattr(module, name, original)
    _saved.clear()
    _caller = None


def _file_event(event: str, args) -> None:
    if event == "open":
        path, mode, flags = args
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _WRITES)
        if not writes:
            return
        what, why = f"opened {path!r} for writing", "a file holds data where the memory ledger cannot see it."
    else:
        what, why = "mapped memory (mmap)", "a mapping holds data where the memory ledger cannot see it."
    who = _caller()
    if who is None or _through_ours():
        return
    _refuse(who, what, why)


# audit event -> its handler(event, args), called while a run is on (allowed.py adds the events that start a
# process): one hook for every rule, since each hook of the process runs on every audited event (sys._getframe,
# object.__getattr__), several per op.
HANDLERS = {"open": _file_event, "mmap.__new__": _file_event}
# The attributes that hand out a frame (allowed.py's frame rule): reading any other audited attribute (every
# f_code read raises "object.__getattr__") is no event for a rule.
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})


def _audit(event: str, args) -> None:
    if _caller is None:  # (no run on: one attribute read per audited event)
        return
    if event == "object.__getattr__" and args[1] not in FRAME_ATTRIBUTES:  # every f_code read: most events of a
        return  # run, each a stack walk's step (allowed.py's handler, which looks for a frame attribute, inline)
    handler = HANDLERS.get(event)
    if handler is not None:
        handler(event, args)


sys.addaudithook(_audit)
