"""Mistakes with tensors and autograd: a detach, a requires_grad_, a clone or a grad mode forgotten, in-place
confused with out-of-place, memory never freed, every rank taking rank 0's share, the wrong dimension, arguments
in the wrong order, a loop in the wrong direction."""

from __future__ import annotations

import ast
import copy

import torch

from .operators import (
    GRAD_MODES,
    NOT_SWAPPED,
    call_name,
    is_rank,
    method_calls,
    operator,
    text_of,
)
from .source import Source


@operator("drop-detach", "forgot detach(): a tensor still tied to the graph it came from")
def drop_detach(src: Source):
    for call in method_calls(src, "detach"):
        yield src.replace(call, copy.deepcopy(call.func.value), "dropped .detach()")


@operator("drop-requires-grad", "forgot requires_grad_(): no gradient flows back to that input")
def drop_requires_grad(src: Source):
    for call in method_calls(src, "requires_grad_"):
        stmt = src.statement_of(call)
        if isinstance(stmt, ast.Expr) and stmt.value is call:
            yield src.delete(stmt, "dropped requires_grad_()")
        else:
            yield src.replace(call, copy.deepcopy(call.func.value), "dropped .requires_grad_()")


@operator("drop-grad-mode", "forgot torch.no_grad() or torch.enable_grad() around a block")
def drop_grad_mode(src: Source):
    for stmt in src.nodes(ast.With):
        for i, item in enumerate(stmt.items):
            if isinstance(item.context_expr, ast.Call) and call_name(item.context_expr) in GRAD_MODES:
                yield src.drop_with_item(stmt, i, f"dropped 'with {text_of(item.context_expr)}'")


@operator("in-place", "out-of-place where the puzzle updates in place (w -= ... -> w = w - ..., mul_ -> mul), "
                      "and in place where autograd needs the old value (x = x + ... -> x += ...)")
def in_place(src: Source):
    for node in src.nodes((ast.AugAssign, ast.Assign, ast.Call)):
        if (isinstance(node, ast.AugAssign) and isinstance(node.target, (ast.Name, ast.Attribute, ast.Subscript))
                and not counts(node.value)):
            load = copy.deepcopy(node.target)
            load.ctx = ast.Load()
            new = ast.Assign([copy.deepcopy(node.target)], ast.BinOp(load, copy.deepcopy(node.op),
                                                                      copy.deepcopy(node.value)), lineno=0)
            yield src.replace(node, new, "in place -> out of place (the name is rebound, the tensor unchanged)")
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
              and isinstance(node.value, ast.BinOp) and isinstance(node.value.left, ast.Name)
              and node.value.left.id == node.targets[0].id):
            new = ast.AugAssign(copy.deepcopy(node.targets[0]), copy.deepcopy(node.value.op),
                                copy.deepcopy(node.value.right))
            yield src.replace(node, new, "out of place -> in place")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.endswith("_")
              and not node.func.attr.startswith("_") and node.func.attr != "requires_grad_"
              and hasattr(torch.Tensor, node.func.attr[:-1])):
            new = copy.deepcopy(node)
            new.func.attr = node.func.attr[:-1]
            yield src.replace(node, new, f".{node.func.attr}(...) -> .{new.func.attr}(...) (the result is a new tensor)")


def counts(node: ast.expr) -> bool:
    """A number, not a tensor (`+= 1`, `+= w.numel()`): in place and out of place are the same for it."""
    return isinstance(node, ast.Constant) or (isinstance(node, ast.Call) and call_name(node) in ("numel", "len"))


@operator("drop-clone", "forgot clone(): a view that keeps its whole base alive, or aliases a buffer")
def drop_clone(src: Source):
    for call in method_calls(src, "clone"):
        yield src.replace(call, copy.deepcopy(call.func.value), "dropped .clone()")


@operator("drop-free", "never let go of a tensor (a `del` or an `= None` is gone)")
def drop_free(src: Source):
    for stmt in src.nodes((ast.Delete, ast.Assign)):
        if isinstance(stmt, ast.Delete) or (isinstance(stmt.value, ast.Constant) and stmt.value.value is None):
            yield src.delete(stmt, f"dropped '{src.line_text(stmt.lineno)}'")


@operator("rank-to-zero", "every rank takes rank 0's share ([rank] -> [0], get_rank() * n -> 0 * n)")
def rank_to_zero(src: Source):
    for node in src.nodes((ast.Subscript, ast.BinOp)):
        if isinstance(node, ast.Subscript) and is_rank(node.slice):
            yield src.replace(node.slice, ast.Constant(0), f"[{text_of(node.slice)}] -> [0]")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for side in (node.left, node.right):
                if is_rank(side):
                    yield src.replace(side, ast.Constant(0), f"{text_of(side)} -> 0")


@operator("wrong-dim", "split or joined along the wrong dimension (chunk/split/cat/stack dim 0 <-> 1)")
def wrong_dim(src: Source):
    for call in src.nodes(ast.Call):
        if call_name(call) not in ("chunk", "split", "tensor_split", "cat", "stack", "concat"):
            continue
        new = copy.deepcopy(call)
        dim = next((k for k in new.keywords if k.arg == "dim"), None)
        if dim is None and len(new.args) >= 2:
            old = new.args[1]
            if not isinstance(old, ast.Constant):
                continue
            new.args[1] = ast.Constant(0 if old.value else 1)
        elif dim is None:
            new.keywords.append(ast.keyword("dim", ast.Constant(1)))
        elif isinstance(dim.value, ast.Constant):
            dim.value = ast.Constant(0 if dim.value.value else 1)
        else:
            continue
        yield src.replace(call, new, f"{call_name(call)} along the other dimension")


@operator("swap-args", "two arguments in the wrong order (output and input of a collective, a loss's prediction "
                       "and target, ...)")
def swap_args(src: Source):
    for call in src.nodes(ast.Call):
        if call_name(call) in NOT_SWAPPED:
            continue
        for i in range(len(call.args) - 1):
            a, b = call.args[i], call.args[i + 1]
            if isinstance(a, ast.Starred) or isinstance(b, ast.Starred) or text_of(a) == text_of(b):
                continue
            new = copy.deepcopy(call)
            new.args[i], new.args[i + 1] = new.args[i + 1], new.args[i]
            yield src.replace(call, new, f"swapped {text_of(a)} and {text_of(b)}")


@operator("reverse-order", "walked a loop or a queue in the wrong direction (range <-> reversed(range), "
                           "popleft() -> pop())")
def reverse_order(src: Source):
    for loop in src.nodes((ast.For, ast.AsyncFor)):
        it = loop.iter
        if isinstance(it, ast.Call) and call_name(it) == "range":
            yield src.replace(it, ast.Call(ast.Name("reversed"), [copy.deepcopy(it)], []), "reversed the loop")
        elif isinstance(it, ast.Call) and call_name(it) == "reversed" and len(it.args) == 1:
            yield src.replace(it, copy.deepcopy(it.args[0]), "the loop no longer reversed")
    for call in method_calls(src, "popleft"):
        new = copy.deepcopy(call)
        new.func.attr = "pop"
        yield src.replace(call, new, "popleft() -> pop(): last in, first out")
