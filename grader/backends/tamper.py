"""Did the answer change the grader, the simulator, torch, or what a puzzle takes away?

The learner's code runs in the grader's own process (the simulator's ranks are threads), so it could rebind a
check, loosen a tolerance, zero a FLOP formula, patch `torch.allclose` or reload a module that a puzzle switches
off, and turn a wrong answer into a pass. So the backends take a fingerprint of everything a verdict rests on
just before the learner's file is loaded, and compare it with a second one taken right after the run: any
difference is tampering, an outcome of its own (status "tampered"), never a pass.

A fingerprint records, for each watched module, the identity of every attribute, and one level deeper: the code,
defaults and closure of each function, the members of each class defined in a watched module (their code too),
the contents of module-level containers (a dict of FLOP formulas, a tuple of budgets) and the attributes of
objects defined in a watched module (the puzzles' SPEC objects). Identities are cheap to take (a few ms) and
change whenever anything is rebound, replaced or reloaded. Caches that legitimately grow during a run are
allowed to grow, not to change what they already held, and their new entries are audited by their owners.

Beyond attributes, a fingerprint holds a look at the process's state (process_state.py): profile and trace
hooks, torch's dispatch modes and thread-local switches, and the dispatcher's kernels for every aten operator (a
`torch.library` registration replaces a kernel without rebinding anything). The standard library modules the
record of a batch run passes through (os, sys, json, dataclasses) are watched like torch.

What this cannot do: a determined learner with the whole process at hand (code objects replaced through names
computed at run time, gc.get_objects, ctypes) can still forge state that leaves every identity in place. The ledger's figures are cross-checked separately (its own
timeline, the storages it tracks: puzzles/simulator/memory.py), and `batch` grades each submission in a
sandboxed child whose results the parent re-derives (docs/grading.md, "Grading for credit").
"""

from __future__ import annotations

import operator
import sys
import threading
import types

from ..core.grading import no_cyclic_gc
from ..core.result import TAMPERED, PuzzleResult
from .process_state import ProcessState

# Modules whose every attribute a verdict may rest on. Prefixes cover a package and its submodules.
WATCHED_PREFIXES = ("grader", "puzzles.sim", "puzzles.simulator", "puzzles.model")
WATCHED_MODULES = ("builtins", "math", "operator", "copy", "functools", "torch", "torch._C", "torch.nn.functional",
                   "torch.autograd", "torch.autograd.function", "torch.autograd.graph", "torch.utils.flop_counter",
                   "torch.utils._python_dispatch", "torch.overrides", "torch.utils.checkpoint", "os", "posix",
                   "sys", "json", "json.encoder", "json.decoder", "dataclasses")
# What a run may change in those modules: the import system's own lists and caches, the standard streams (a test
# runner captures them), and what the interpreter notes after an uncaught exception.
UNWATCHED = {"sys.path", "sys.argv", "sys.modules", "sys.path_importer_cache", "sys.meta_path", "sys.path_hooks",
             "sys.stdin", "sys.stdout", "sys.stderr", "sys.last_type", "sys.last_value", "sys.last_traceback",
             "sys.last_exc", "posix.environ"}  # (os.environ, the same variables, is watched as an object)
# Classes outside those modules whose members matter as much (torch.Tensor's Python methods: __sub__, allclose...).
WATCHED_CLASSES = ("torch.Tensor", "torch.storage.UntypedStorage", "torch.storage._StorageBase")
# Module-level caches of the project's that fill in during a run: new keys are fine, a changed value is not. (In
# torch and the standard library every module-level dict may gain entries: registries such as
# copy.dispatch_table fill in lazily. Losing or changing an entry is still tampering.)
GROWING = {"puzzles.simulator.op_costs._RULES"}
_GROWING_IN = {}  # GROWING by module, as _UNWATCHED_IN below
for _dotted in GROWING:
    _GROWING_IN.setdefault(_dotted.rpartition(".")[0], set()).add(_dotted.rpartition(".")[2])
_UNWATCHED_IN = {}  # UNWATCHED by module: {"sys": {"path", ...}}, so a fingerprint builds no dotted name per attribute
for _dotted in UNWATCHED:
    _UNWATCHED_IN.setdefault(_dotted.rpartition(".")[0], set()).add(_dotted.rpartition(".")[2])
_NONE_UNWATCHED = frozenset()


def _rule_is_its_own(func, rule) -> bool:
    """An entry of op_costs' cache of rules: the rule the simulator derives for that op, and nothing else (an
    answer that put a rule of its own there, say mm as free, would compute off the clock)."""
    from puzzles.simulator.op_costs import rule_of

    try:
        return rule == rule_of(func)
    except Exception:  # not an op at all
        return False


# The entries such a cache gains during a run must be the ones it would have computed itself.
GROWN_ENTRIES_CHECK = {"puzzles.simulator.op_costs._RULES": _rule_is_its_own}
_SKIP_TYPES = (types.ModuleType, threading.local)
# Types whose objects hold nothing a fingerprint looks inside (no code, no items, no attributes of the project's):
# the builtin functions and descriptors that make up most of torch's and its classes' names. Exact types only.
_PLAIN = frozenset({types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
                    types.GetSetDescriptorType, types.MemberDescriptorType, types.ClassMethodDescriptorType,
                    types.MethodWrapperType, property, bool, int, float, complex, str, bytes, type(None)})
# torch keeps state in module-level scalars (flags that its dispatch modes toggle): in torch and the standard
# library only objects are watched; in the project's own modules every scalar too (a tolerance, a budget).
_SCALARS = (bool, int, float, complex, str, bytes, type(None))
_FUNCTION_PARTS = ("__code__", "__defaults__", "__kwdefaults__", "__closure__")


class _Print:
    """One attribute as it was: the object, and one level of what it holds (parts of a function, members of a
    class, items of a container, attributes of an object). Compared by identity, restored by assignment."""

    __slots__ = ("value", "parts", "kind")

    def __init__(self, value, owner: str, depth: int = 0):
        self.value, self.parts, self.kind = value, None, "object"
        if type(value) in _PLAIN or isinstance(value, _SKIP_TYPES):  # most of torch's names: nothing inside to watch
            return
        inside = _inside(value, owner, depth)
        if inside is not None:
            self.kind, self.parts = inside

    def same_as(self, later, grow_ok: bool = False) -> bool:
        if type(later) is not _Print:  # (the look of a value with nothing inside is the value itself: _look)
            return later is self.value and self.kind == "object"
        if later.value is not self.value:
            return False
        if self.kind == "function" or (self.kind == "container" and isinstance(self.value, list)):
            return len(self.parts) == len(later.parts) and all(a is b for a, b in zip(self.parts, later.parts))
        if self.kind == "container":  # a set: same members, in any order
            return sorted(map(id, self.parts)) == sorted(map(id, later.parts))
        if self.kind == "class":
            return _members_same(self.parts, later.parts)
        if self.kind in ("dict", "instance"):
            if not grow_ok and self.parts.keys() != later.parts.keys():
                return False
            return all(k in later.parts and later.parts[k] is v for k, v in self.parts.items())
        return True

    def restore(self) -> None:
        """Put what this attribute held back in place (its code, its contents, its members)."""
        target = self.value
        if self.kind == "function":
            func = target.__func__ if isinstance(target, (staticmethod, classmethod)) else target
            for name, part in zip(_FUNCTION_PARTS, self.parts):
                if name != "__closure__" and getattr(func, name) is not part:
                    setattr(func, name, part)
        elif self.kind == "class":
            _restore_members(target, self.parts)
        elif self.kind == "dict":
            target.clear()
            target.update(self.parts)
        elif self.kind == "container":
            if isinstance(target, list):
                target[:] = self.parts
            else:
                target.clear()
                target.update(self.parts)
        elif self.kind == "instance":
            vars(target).clear()
            vars(target).update(self.parts)


_function_parts = operator.attrgetter(*_FUNCTION_PARTS)


def _inside(value, owner: str, depth: int = 0):
    """(kind, parts) of what a _Print watches inside `value`, or None when there is nothing inside to watch."""
    if isinstance(value, types.FunctionType):
        return "function", _function_parts(value)
    if isinstance(value, (staticmethod, classmethod)) and isinstance(value.__func__, types.FunctionType):
        return "function", _function_parts(value.__func__)
    if depth:
        return None
    if isinstance(value, type):
        return ("class", _members(value)) if getattr(value, "__module__", "") == owner else None
    if isinstance(value, dict):
        return "dict", dict(value)
    if isinstance(value, (list, set)):
        return "container", list(value)
    if _ours_instance(value):  # a spec, a cost model: an object of one of the project's classes
        return "instance", dict(vars(value))
    return None


def _look(value, owner: str):
    """One attribute's look: a _Print where there is something inside to watch (a function's code, a class's
    members, a container's items, a project object's attributes), else the value itself, compared by identity.
    Most of the 7,000 attributes a fingerprint holds are builtins and descriptors: an object apiece for them was
    half of a fingerprint's time."""
    if type(value) in _PLAIN or isinstance(value, _SKIP_TYPES):
        return value
    inside = _inside(value, owner)
    if inside is None:
        return value
    look = _Print.__new__(_Print)
    look.value, (look.kind, look.parts) = value, inside
    return look


def _value(look):
    """The attribute a look (_look's) was taken of."""
    return look.value if type(look) is _Print else look


# Set on a class by Python itself: copyreg caches __slotnames__ the first time an instance is copied or pickled.
_BOOKKEEPING = ("__dict__", "__weakref__", "__slotnames__")


def _ours_instance(value) -> bool:
    """An object of a class of the grader's or the simulator's (a SPEC, a CostModel): its attributes matter."""
    return (str(getattr(type(value), "__module__", "")).startswith(WATCHED_PREFIXES)
            and not isinstance(value, type) and hasattr(value, "__dict__"))


def _inner(value):
    """One level of what a class member holds: a function's code and defaults, a project object's attributes."""
    kind = type(value)
    if kind in _PLAIN:
        return None
    if kind is types.FunctionType:  # (FunctionType cannot be subclassed)
        return _function_parts(value)
    if _ours_instance(value):
        return dict(vars(value))
    return None


def _inner_same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, tuple):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))
    return a.keys() == b.keys() and all(b[k] is v for k, v in a.items())


_IMMUTABLE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE (Python 3.10): no attribute of the class can be set or deleted


def _members(cls: type) -> dict:
    """{name: (member, _inner(member))} of a class. A type Python marks immutable (int, str, torch.dtype,
    torch.Size: most of the classes builtins and torch define) refuses every assignment to it, so only what could
    change in place is kept of it: its Python functions, whose code could be swapped (there are seldom any)."""
    if cls.__flags__ & _IMMUTABLE:
        return {k: (v, _inner(v)) for k, v in list(vars(cls).items()) if type(v) is types.FunctionType}
    return {k: (v, _inner(v)) for k, v in list(vars(cls).items()) if k not in _BOOKKEEPING}


def _members_same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    return all(b[k][0] is v and _inner_same(inner, b[k][1]) for k, (v, inner) in a.items())


def _restore_members(cls: type, members: dict) -> None:
    if cls.__flags__ & _IMMUTABLE:  # (its members cannot have changed; its functions' code can)
        members = {k: v for k, v in members.items() if type(v[0]) is types.FunctionType}
        for k, (v, inner) in members.items():
            for name, part in zip(_FUNCTION_PARTS, inner):
                if name != "__closure__" and getattr(v, name) is not part:
                    setattr(v, name, part)
        return
    for k in [k for k in list(vars(cls)) if k not in members and k not in _BOOKKEEPING]:
        delattr(cls, k)
    for k, (v, inner) in members.items():
        if vars(cls).get(k) is not v:
            setattr(cls, k, v)
        if isinstance(inner, tuple):
            for name, part in zip(_FUNCTION_PARTS, inner):
                if name != "__closure__" and getattr(v, name) is not part:
                    setattr(v, name, part)
        elif isinstance(inner, dict) and not _inner_same(inner, dict(vars(v))):
            vars(v).clear()
            vars(v).update(inner)


def _torch_own(value) -> bool:
    """An object torch made itself. Importing a torch submodule lazily (torch.optim's first step imports
    torch._dynamo) adds it to `torch`: torch's own doing."""
    module = getattr(value, "__module__", None) or ""
    return module == "torch" or module.startswith("torch.")


def _torch_did(before, after) -> bool:
    """A change in a module of torch's (or the standard library's) that torch makes itself, as it runs: a name a
    lazy import rewraps (torch._dynamo's wraps torch.manual_seed: the wrapper is torch's and wraps what was
    there), and a flag on one of torch's classes (torch.utils.checkpoint's DefaultDeviceType notes the device in
    a class attribute). Any other change is an answer's, torch's objects included: torch.float64 = torch.float32
    rebinds a name to a torch object (the reference would compute in float32), and a torch function whose code
    was swapped is still torch's function."""
    old, new = _value(before), _value(after)
    if new is not old:
        return _torch_own(new) and getattr(new, "__wrapped__", None) is old
    if type(before) is not _Print or before.kind != "class" or type(after) is not _Print:
        return False
    a, b = before.parts, after.parts
    changed = [k for k in a.keys() | b.keys() if k not in a or k not in b or not _members_same({k: a[k]}, {k: b[k]})]
    return _torch_own(old) and all(isinstance(side[k][0], _SCALARS) for k in changed for side in (a, b) if k in side)


def _what_changed(where: str, before, after) -> list[str]:
    """'x was rebound to another object', or which members, items or attributes of x changed (`before` and
    `after`: two looks, _look's)."""
    if _value(after) is not _value(before) or type(before) is not _Print or type(after) is not _Print:
        return [f"{where} was rebound to another object"]
    if before.kind == "function":
        return [f"{where} was modified in place (its code, defaults or closure)"]
    if before.kind == "class":
        keys = before.parts.keys() | after.parts.keys()
        changed = [k for k in sorted(keys) if k not in before.parts or k not in after.parts
                   or not _members_same({k: before.parts[k]}, {k: after.parts[k]})]
        return [f"{where}.{k} was changed" for k in changed] or [f"{where} was changed"]
    if before.kind in ("dict", "instance"):
        keys = before.parts.keys() | after.parts.keys()
        changed = [k for k in keys if before.parts.get(k, _MISSING) is not after.parts.get(k, _MISSING)]
        if before.kind == "instance" and changed:
            return [f"{where}.{k} was changed" for k in sorted(map(str, changed))]
        return [f"{where} was modified in place ({len(changed)} entries changed)"]
    return [f"{where} was modified in place"]


def _watched_names(extra=()) -> list[str]:
    names = [n for n in list(sys.modules) if n.startswith(WATCHED_PREFIXES)]
    names += [n for n in WATCHED_MODULES if n in sys.modules]
    return sorted(set(names) | {n for n in extra if n in sys.modules})


def _resolve(dotted: str):
    module, _, attr = dotted.rpartition(".")
    while module and module not in sys.modules:
        module, _, more = module.rpartition(".")
        attr = f"{more}.{attr}"
    obj = sys.modules.get(module)
    for part in attr.split("."):
        obj = getattr(obj, part, None)
    return obj


class Fingerprint:
    """What the watched modules (and any `extra` module a caller names) look like now, and the process's state
    (process_state.py; its kernels only `with_kernels`, the look after a run). The names of every other module
    are taken only for a look before (`changes` compares them with the modules as they are then): a look after,
    `with_kernels`, leaves them out."""

    def __init__(self, extra=(), with_kernels: bool = False, force_kernels: bool = False):
        with no_cyclic_gc():  # tens of thousands of small objects, no cycle: a collection here walked the heap
            self._take(extra, with_kernels, force_kernels)

    def _take(self, extra, with_kernels: bool, force_kernels: bool) -> None:
        self.modules: dict[str, tuple] = {}
        for name in _watched_names(extra):
            module = sys.modules.get(name)
            if module is not None:
                ours, unwatched = name.startswith(WATCHED_PREFIXES), _UNWATCHED_IN.get(name, _NONE_UNWATCHED)
                self.modules[name] = (module, {k: _look(v, name) for k, v in list(vars(module).items())
                                               if not (k.startswith("__") and k.endswith("__"))
                                               and k not in unwatched
                                               and (ours or not isinstance(v, _SCALARS))})
        self.classes = {dotted: _Print(cls, getattr(cls, "__module__", "")) for dotted in WATCHED_CLASSES
                        if isinstance(cls := _resolve(dotted), type)}
        # Every other module, by its names only (in their order: a tuple is quicker to take and to compare than a
        # set): an answer that hangs data on one (zlib.stash = state) keeps it where no ledger looks and, on the
        # simulator, across a restart that should have lost it (p18).
        self.names = None if with_kernels else {
            name: (module, tuple(vars(module))) for name, module in list(sys.modules.items())
            if name not in self.modules and isinstance(module, types.ModuleType)}
        self.state = ProcessState(with_kernels, force_kernels)
        self.found: list[str] = []  # hooks cleared since this fingerprint was taken (unhook)

    def unhook(self) -> None:
        """Clear the profile and trace hooks installed since this fingerprint (an answer's import installs them
        in the grader's own thread, where they would see its every call); `changes` names them."""
        self.found += self.state.unhook()

    def changes(self, later: Fingerprint) -> list[str]:
        """What differs in `later`, in words ('grader.core.compare.REL_TOL was rebound to another object')."""
        with no_cyclic_gc():
            return self._changes(later)

    def _changes(self, later: Fingerprint) -> list[str]:
        out = [*self.found, *self.state.changes(later.state)]
        for name, (module, attrs) in self.modules.items():
            if name not in later.modules or later.modules[name][0] is not module:
                out.append(f"module {name} was replaced or removed in sys.modules")
                continue
            attrs2 = later.modules[name][1]
            ours = name.startswith(WATCHED_PREFIXES)
            growing = _GROWING_IN.get(name, _NONE_UNWATCHED)
            for attr, before in attrs.items():
                after = attrs2.get(attr, _MISSING)
                if after is before:  # (a value with nothing inside, still in place: most attributes)
                    continue
                where = f"{name}.{attr}"
                if after is _MISSING:
                    out.append(f"{where} was deleted")
                elif type(before) is not _Print:
                    if ours or not _torch_did(before, after):
                        out += _what_changed(where, before, after)
                elif not before.same_as(after, grow_ok=attr in growing or not ours) and (
                        ours or not _torch_did(before, after)):
                    out += _what_changed(where, before, after)
                elif where in GROWN_ENTRIES_CHECK:
                    grown, check = after.parts, GROWN_ENTRIES_CHECK[where]
                    forged = [k for k in grown.keys() - before.parts.keys() if not check(k, grown[k])]
                    if forged:
                        out.append(f"{where} gained {len(forged)} entries that are not the simulator's own "
                                   f"({', '.join(map(str, forged[:3]))})")
            out += [f"{name}.{attr} was added" for attr in sorted(attrs2.keys() - attrs.keys())
                    if ours or not (isinstance(_value(attrs2[attr]), (*_SCALARS, types.ModuleType))
                                    or _torch_own(_value(attrs2[attr])))]
        for name, added in self._names_added().items():
            out += [f"{name}.{attr} was added" for attr in added]
        for dotted, before in self.classes.items():
            after = later.classes.get(dotted)
            if after is None:
                out.append(f"class {dotted} was replaced")
            elif not before.same_as(after):
                out += _what_changed(dotted, before, after)
        return out

    def _names_added(self) -> dict[str, list[str]]:
        """{module: the names added to it since}, of the modules only `names` watches: plain data added to a
        module (not a submodule imported since, not a dunder such as __warningregistry__, not a flag)."""
        if self.names is None:
            raise ValueError("a look after a run (with_kernels) holds no names to compare: take the look before it")
        out = {}
        for name, (module, before) in self.names.items():
            if sys.modules.get(name) is not module:
                continue
            now = vars(module)
            if len(now) == len(before) and tuple(now) == before:  # (the common case: nothing added, nothing gone)
                continue
            added = sorted(k for k in now.keys() - set(before) if isinstance(k, str) and not (
                k.startswith("__") and k.endswith("__")) and not _a_flag(now[k]))
            if added:
                out[name] = added
        return out

    def restore(self) -> None:
        """Undo every change since this fingerprint was taken, so that the runs after a tampered one are sound."""
        for name, added in self._names_added().items():
            for attr in added:
                vars(self.names[name][0]).pop(attr, None)
        self.state.restore()
        now = Fingerprint()
        for name, (module, attrs) in self.modules.items():
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
            current, later = vars(module), now.modules.get(name, (None, {}))[1]
            for attr in [a for a in list(current) if a not in attrs and a in later]:
                del current[attr]
            for attr, before in attrs.items():
                if current.get(attr, _MISSING) is not _value(before):
                    current[attr] = _value(before)
                if type(before) is _Print and (attr not in later or not before.same_as(later[attr])):
                    before.restore()
        for dotted, before in self.classes.items():
            if dotted not in now.classes or not before.same_as(now.classes[dotted]):
                before.restore()


_MISSING = object()


def _a_flag(value) -> bool:
    """What a library may note on its own module as it runs (a flag, a count, a short name, a submodule it
    imported), as opposed to data an answer hides there (a dict of tensors, a bytes of torch.save's)."""
    if isinstance(value, (str, bytes)):
        return len(value) < 256
    return isinstance(value, (bool, int, float, complex, type(None), types.ModuleType))


def describe(changes: list[str], limit: int = 6) -> str:
    """The tampering, for the result's error text."""
    shown = "; ".join(changes[:limit]) + (f"; and {len(changes) - limit} more" if len(changes) > limit else "")
    return (f"your code modified what the grader relies on: {shown}. A verdict cannot rest on a run that changed "
            f"the grader, the simulator or torch, so this answer is not graded. Change only your own code.")


def untampered(spec, before: Fingerprint, outcome):
    """`outcome`, unless something the grader relies on changed since `before`: then a "tampered" result (and
    the change is undone, so that what runs next is sound)."""
    changes = before.changes(Fingerprint(with_kernels=True))
    if not changes:
        return outcome
    before.restore()
    return PuzzleResult(spec.id, spec.name, spec.title, TAMPERED, error=describe(changes))


# ---- internals no answer needs: reaching for them is how the checks above would be bypassed

# Modules an answer never imports: the grader, the simulator's insides (`dist` and puzzles.sim are the API), the
# dispatcher's internals (switching the rank's dispatch mode off hides ops from the ledger and the clock), raw
# memory access, and reloading.
_FORBIDDEN_MODULES = ("grader", "puzzles.simulator", "torch._C", "torch.utils._python_dispatch", "torch._dispatch",
                      "torch.utils._mode_utils", "ctypes", "importlib", "gc")
# Attributes an answer never touches: the runtime's private state, and the levers of the dispatcher and of
# Python's introspection that reach the grader's objects.
_FORBIDDEN_ATTRIBUTES = {
    "_world", "_me", "_live", "_peak_live", "_refs", "_sizes", "_problems", "_still_alive", "_alive_keys",
    "_RULES", "rule_of", "flop_registry", "_disable_current_modes", "_pop_mode", "_push_mode", "_pop_mode_temporarily",
    "_DisableTorchDispatch", "_get_current_dispatch_mode_stack", "get_objects", "get_referrers", "_getframe",
    "_current_frames", "settrace", "setprofile", "__code__", "__globals__", "__closure__", "__builtins__",
    "_disk", "_changes", "_dead",  # the checkpoint disk's own state behind `fs` (its armed crash point, p18)
}


def internals_used(source: str, filename: str = "") -> list[str]:
    """Where an answer's source reaches into internals ('line 3: import torch.utils._python_dispatch'); [] for
    an ordinary answer. A static scan: it cannot see through exec or getattr with a computed name, which is what
    the fingerprint and the ledger's audit are for."""
    import ast

    try:
        tree = ast.parse(source, filename or "<answer>")
    except SyntaxError:
        return []
    lines = source.splitlines()
    found = []

    def note(node, what):
        text = lines[node.lineno - 1].strip() if 0 < node.lineno <= len(lines) else ""
        found.append(f"line {node.lineno}: {what} ({text})")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(_FORBIDDEN_MODULES) and _is_module(alias.name):
                    note(node, f"imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith(_FORBIDDEN_MODULES) and _is_module(node.module):
                note(node, f"imports from {node.module}")
            for alias in node.names:
                if alias.name in _FORBIDDEN_ATTRIBUTES:
                    note(node, f"imports {alias.name}")
        elif isinstance(node, ast.Attribute) and node.attr in _FORBIDDEN_ATTRIBUTES:
            note(node, f"uses .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in ("__builtins__",):
            note(node, f"uses {node.id}")
    return found


def _is_module(name: str) -> bool:
    """'torch._C' and 'torch._C.foo' are internal; 'torch._Calculated' is not a prefix match we mean."""
    return any(name == m or name.startswith(m + ".") for m in _FORBIDDEN_MODULES)


def describe_internals(found: list[str], limit: int = 4) -> str:
    shown = "; ".join(found[:limit]) + (f"; and {len(found) - limit} more" if len(found) > limit else "")
    return (f"your code reaches into the grader's or the runtime's internals: {shown}. No puzzle needs them (use "
            f"the `dist` your function receives, torch's public API and puzzles.model), and they are how a "
            f"verdict would be forged, so this answer is not graded. Remove them.")
