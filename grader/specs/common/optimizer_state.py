"""What an optimizer object keeps, read without knowing how it is written: p9's "skipped step" rule and p8's
"state in float64" rule.

A skipped step must leave Adam's state as it was. The learner's class may keep m and v in lists, in one flat
tensor, in a dict, or inside a torch.optim.Adam: so the state is every tensor reachable from the object's
attributes, through lists, tuples, dicts (keys and values) and the attributes of other objects, named by the path
that reaches it ("opt.m[0]", "opt.adam.state[<key 1>]['exp_avg']"). The runtime's and the grader's objects are
never entered: a `dist` kept on the optimizer leads to the world and every rank's memory. Tensors of one number (a scale, a counter,
torch.optim.Adam's 'step') are left out: a skipped step may change the scale and the count of good steps.

Runs on the rank, inside the grader's program, on both backends: the snapshot's clones are the rank's memory.
"""

from __future__ import annotations

import types

import torch
from torch.utils._python_dispatch import _disable_current_modes

MAX_DEPTH = 8  # deep enough for a torch.optim.Adam held by the learner's object (opt.adam.state[p]['exp_avg'])
_SKIP = (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType)
_NOT_STATE = ("puzzles.sim", "grader", "torch.distributed")  # puzzles.sim* is the runtime, puzzles.simulator too


def _enter(x) -> bool:
    return not (type(x).__module__ or "").startswith(_NOT_STATE)


def state_tensors(obj, name: str = "opt") -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor of more than one number reachable from `obj`, each tensor once."""
    found: list[tuple[str, torch.Tensor]] = []
    seen: set[int] = set()

    def walk(x, path: str, depth: int) -> None:
        if id(x) in seen or depth > MAX_DEPTH or isinstance(x, (_SKIP, str, bytes, int, float, bool)) or x is None:
            return
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            if x.numel() > 1:
                found.append((path, x))
            return
        if isinstance(x, dict):
            for i, (k, v) in enumerate(list(x.items())):
                label = f"<key {i}>" if isinstance(k, torch.Tensor) else repr(k)
                walk(k, f"{path}.keys()[{i}]", depth + 1)
                walk(v, f"{path}[{label}]", depth + 1)
        elif isinstance(x, (list, tuple, set, frozenset)):
            for i, v in enumerate(list(x)):
                walk(v, f"{path}[{i}]", depth + 1)
        elif hasattr(x, "__dict__") and not callable(x) and _enter(x):
            for k, v in list(vars(x).items()):
                walk(v, f"{path}.{k}", depth + 1)

    walk(obj, name, 0)
    return found


def dtype_counts(obj) -> dict[str, int]:
    """{dtype: elements} of the floating-point state tensors state_tensors() finds: p8's "state in float64"."""
    counts: dict[str, int] = {}
    for _, t in state_tensors(obj):
        if t.is_floating_point():
            name = str(t.dtype).replace("torch.", "")
            counts[name] = counts.get(name, 0) + t.numel()
    return counts


def named_state(obj, extra: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`extra` (tensors the grader gave the object, under the grader's names) and then the object's own state
    tensors, each tensor once, by path."""
    named = dict(extra)
    given = {id(t) for t in extra.values()}
    named.update((path, t) for path, t in state_tensors(obj) if id(t) not in given)
    return named


def snapshot(obj, extra: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Clones of what named_state() finds, by path."""
    with torch.no_grad():
        return {path: t.detach().clone() for path, t in named_state(obj, extra).items()}


def changes(before: dict[str, torch.Tensor], obj, extra: dict[str, torch.Tensor]) -> list[dict]:
    """What differs from `before`, path by path: [{path, what, numel, changed}] (changed: entries not bit for bit
    equal; a tensor gone from its path, or of another shape or dtype, counts as changed everywhere)."""
    now = named_state(obj, extra)
    out = []
    with torch.no_grad():
        for path, old in before.items():
            new = now.get(path)
            if new is not None and (new.layout != torch.strided or old.layout != torch.strided):
                # sparse state (a way to hide it from the ledger, which charges it all the same): its values
                new, old = new.to_dense(), old.to_dense()
            if new is None or new.shape != old.shape or new.dtype != old.dtype:
                what = "is gone" if new is None else f"became {new.dtype}{list(new.shape)}"
                out.append({"path": path, "what": what, "numel": old.numel(), "changed": old.numel()})
                continue
            same = (new == old) | (torch.isnan(new) & torch.isnan(old)) if new.is_floating_point() else new == old
            n = int(old.numel() - int(same.sum()))
            if n:
                out.append({"path": path, "what": f"{old.dtype}{list(old.shape)}", "numel": old.numel(),
                            "changed": n})
    return out


def slices_of(obj, weights, size: int) -> list[dict]:
    """p8: the optimizer's state tensors of `size` numbers that hold initial weights, right after it was made:
    [{path, offset}], offset where the tensor equals that slice of the weights flattened in order, or None when its
    numbers all come from the weights but not as one slice. The grader's own work: off the ledger and the clock."""
    found = []
    with torch.no_grad(), _disable_current_modes():
        flat = torch.cat([w.detach().reshape(-1) for w in weights])
        theirs = {w.untyped_storage().data_ptr() for w in weights}
        for path, t in state_tensors(obj):
            if t.layout != torch.strided or t.numel() != size or not t.is_floating_point() or \
                    t.dtype != flat.dtype or t.untyped_storage().data_ptr() in theirs:  # the weights themselves (here each is Ψ/N numbers)
                continue
            values = t.detach().reshape(-1)
            if not values.any() or not torch.isin(values, flat).all():
                continue  # zeros (m, v) or numbers that are not the weights'
            starts = (flat[:flat.numel() - size + 1] == values[0]).nonzero().reshape(-1).tolist()
            offset = next((a for a in starts if torch.equal(flat[a:a + size], values)), None)
            found.append({"path": path, "offset": offset})
    return found
