"""What a mutation operator is, the registry the operator modules fill (ops_*.py), the AST helpers they share,
and `mutants()`, which applies every registered operator to one reference."""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .source import Edit, Mutant, Source

COMMUNICATION = {"send", "recv", "isend", "irecv", "batch_isend_irecv", "P2POp", "all_reduce", "all_gather",
                 "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "broadcast", "barrier",
                 "reduce", "gather", "scatter", "all_to_all", "all_to_all_single"}
POINT_TO_POINT = {"send", "recv", "isend", "irecv", "P2POp"}
REDUCING = {"all_reduce": 1, "reduce_scatter_tensor": 2, "reduce_scatter": 2, "reduce": 2}  # index of a positional op
GRAD_MODES = {"no_grad", "enable_grad", "inference_mode", "set_grad_enabled"}
NOT_SWAPPED = {"range", "min", "max", "zip", "enumerate", "isinstance", "getattr", "setattr", "print", "P2POp"}


@dataclass(frozen=True)
class Operator:
    name: str
    mistake: str  # the learner's mistake it mirrors
    edits: Callable[[Source], Iterator[Edit | None]]


OPERATORS: dict[str, Operator] = {}


def operator(name: str, mistake: str):
    def register(fn):
        OPERATORS[name] = Operator(name, mistake, fn)
        return fn
    return register


def mutants(source: Source, puzzle: str, names=None) -> list[Mutant]:
    """Every first-order mutant of the solution regions, once each (two operators that make the same text make
    one mutant, credited to the first)."""
    seen, out = {source.text}, []
    for op in OPERATORS.values():
        if names and op.name not in names:
            continue
        for edit in op.edits(source):
            m = source.mutant(puzzle, op.name, edit) if edit is not None else None
            if m is not None and m.source not in seen:
                seen.add(m.source)
                out.append(m)
    return out


def call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def method_calls(source: Source, name: str):
    return [c for c in source.nodes(ast.Call) if isinstance(c.func, ast.Attribute) and c.func.attr == name]


def is_rank(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "rank") or (
        isinstance(node, ast.Call) and call_name(node) == "get_rank")


def shifted(node: ast.expr, by: int) -> ast.expr:
    """`node + by`, folding into a constant it already adds or subtracts (`i + 1` shifted by -1 is `i`)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return ast.Constant(node.value + by)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)) and isinstance(
            node.right, ast.Constant) and type(node.right.value) is int:
        total = (node.right.value if isinstance(node.op, ast.Add) else -node.right.value) + by
        if total == 0:
            return copy.deepcopy(node.left)
        return ast.BinOp(copy.deepcopy(node.left), ast.Add() if total > 0 else ast.Sub(), ast.Constant(abs(total)))
    return ast.BinOp(copy.deepcopy(node), ast.Add() if by > 0 else ast.Sub(), ast.Constant(abs(by)))


def text_of(node: ast.AST) -> str:
    return ast.unparse(node)
