"""Mistakes in arithmetic and conditions: a division forgotten or done twice, a bound or a count off by one, a
guard forgotten."""

from __future__ import annotations

import ast
import copy

from .operators import call_name, operator, shifted, text_of
from .source import Source


@operator("drop-division", "forgot to average or to scale (a division is gone)")
def drop_division(src: Source):
    for node in src.nodes((ast.BinOp, ast.AugAssign)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            yield src.replace(node, copy.deepcopy(node.left), f"dropped '/ {text_of(node.right)}'")
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div):
            yield src.delete(node, f"dropped '/= {text_of(node.value)}'")


@operator("double-division", "averaged twice (a division done two times)")
def double_division(src: Source):
    for node in src.nodes((ast.BinOp, ast.AugAssign)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            new = ast.BinOp(copy.deepcopy(node), ast.Div(), copy.deepcopy(node.right))
            yield src.replace(node, new, f"divided by {text_of(node.right)} twice")
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div):
            new = ast.BinOp(copy.deepcopy(node.value), ast.Mult(), copy.deepcopy(node.value))
            yield src.replace(node.value, new, f"divided by {text_of(node.value)} twice")


@operator("off-by-one", "a loop, a slice or a count one too long or too short (range and slice bounds +-1, "
                        "< <-> <=, min/max +-1)")
def off_by_one(src: Source):
    for node in src.nodes((ast.Call, ast.Slice, ast.Compare)):
        if isinstance(node, ast.Call) and call_name(node) in ("range", "min", "max"):
            for i, arg in enumerate(node.args):
                for by in (1, -1):
                    yield src.replace(arg, shifted(arg, by), _described(node, "args", i, shifted(arg, by)))
        elif isinstance(node, ast.Slice):
            subscript = src.parent[node]
            for field in ("lower", "upper"):
                bound = getattr(node, field)
                for by in (1, -1) if bound is not None else ():
                    new = copy.deepcopy(subscript)
                    setattr(new.slice, field, shifted(bound, by))
                    yield src.replace(bound, shifted(bound, by), f"{text_of(subscript)} -> {text_of(new)}")
        elif isinstance(node, ast.Compare):
            flips = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
            for i, op in enumerate(node.ops):
                if type(op) in flips:
                    new = copy.deepcopy(node)
                    new.ops[i] = flips[type(op)]()
                    yield src.replace(node, new, f"{text_of(node)} -> {text_of(new)}")


def _described(call: ast.Call, field: str, index: int, new_arg: ast.expr) -> str:
    """'range(n) -> range(n + 1)': the whole call before and after, so the change reads in context."""
    new = copy.deepcopy(call)
    getattr(new, field)[index] = new_arg
    return f"{text_of(call)} -> {text_of(new)}"


@operator("drop-guard", "forgot a condition: the first or last stage's special case, the every-k-th test "
                        "(`if C:` -> `if True:`)")
def drop_guard(src: Source):
    for stmt in src.nodes(ast.If):
        if not (isinstance(stmt.test, ast.Constant) and stmt.test.value is True):
            yield src.replace(stmt.test, ast.Constant(True), f"the guard '{text_of(stmt.test)}' forgotten")
