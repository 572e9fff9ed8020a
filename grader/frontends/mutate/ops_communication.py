"""Mistakes in communication: the wrong reduction, a call forgotten, a wait forgotten, the wrong peer, two
statements around a call in the wrong order."""

from __future__ import annotations

import ast
import copy
import itertools

from .operators import (
    COMMUNICATION,
    POINT_TO_POINT,
    REDUCING,
    call_name,
    is_rank,
    method_calls,
    operator,
    text_of,
)
from .source import Source


@operator("reduce-op", "summed where the puzzle averages, or averaged and then divided again (ReduceOp.SUM <-> AVG)")
def reduce_op(src: Source):
    for call in src.nodes(ast.Call):
        if call_name(call) not in REDUCING:
            continue
        op = next((k for k in call.keywords if k.arg == "op"), None)
        if op is not None and isinstance(op.value, ast.Attribute) and op.value.attr in ("SUM", "AVG"):
            new = copy.deepcopy(op.value)
            new.attr = "AVG" if op.value.attr == "SUM" else "SUM"
            yield src.replace(op.value, new, f"ReduceOp.{op.value.attr} -> ReduceOp.{new.attr}")
        elif op is None and isinstance(call.func, ast.Attribute) and len(call.args) <= REDUCING[call_name(call)]:
            new = copy.deepcopy(call)
            avg = ast.Attribute(ast.Attribute(copy.deepcopy(call.func.value), "ReduceOp"), "AVG")
            new.keywords.append(ast.keyword("op", avg))
            yield src.replace(call, new, f"{call_name(call)} sums by default -> op=ReduceOp.AVG")


@operator("drop-collective", "forgot a collective, a send, a receive or one op of a batch (the statement is gone)")
def drop_collective(src: Source):
    for call in src.nodes(ast.Call):
        if call_name(call) not in COMMUNICATION:
            continue
        stmt = src.statement_of(call)
        inside_iter = isinstance(stmt, (ast.For, ast.AsyncFor)) and any(n is call for n in ast.walk(stmt.iter))
        if inside_iter or not isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With)):
            yield src.delete(stmt, f"dropped {call_name(call)}(...)")


@operator("drop-wait", "never waited for an async op (its wait() is gone)")
def drop_wait(src: Source):
    for call in method_calls(src, "wait"):
        stmt = src.statement_of(call)
        if isinstance(stmt, ast.Expr) and stmt.value is call:
            yield src.delete(stmt, "dropped wait()")


@operator("wrong-peer", "sent to or received from the wrong neighbour (rank + 1 <-> rank - 1)")
def wrong_peer(src: Source):
    for call in src.nodes(ast.Call):
        if call_name(call) not in POINT_TO_POINT:
            continue
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            if isinstance(arg, ast.BinOp) and isinstance(arg.op, (ast.Add, ast.Sub)) and is_rank(arg.left):
                new = copy.deepcopy(arg)
                new.op = ast.Sub() if isinstance(arg.op, ast.Add) else ast.Add()
                yield src.replace(arg, new, f"{text_of(arg)} -> {text_of(new)}")


@operator("swap-statements", "sent before receiving, waited before launching, divided before reducing: two "
                             "neighbouring statements, one of them a communication call, in the other order")
def swap_statements(src: Source):
    for node in ast.walk(src.tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for a, b in itertools.pairwise(block):
                if (src.in_region(a) and src.in_region(b) and (communicates(a) or communicates(b))
                        and not any(isinstance(s, (ast.FunctionDef, ast.Return)) for s in (a, b))
                        and not depends(a, b)):
                    yield src.swap(a, b, f"swapped with the next statement: {src.line_text(b.lineno)}")


def communicates(stmt: ast.stmt) -> bool:
    """A communication call (or a wait) in the statement itself, or in a statement directly inside it (the
    `else: dist.recv(...)` of an if, the `work.wait()` of a loop)."""
    def direct(s):
        if isinstance(s, (ast.For, ast.While, ast.If, ast.With, ast.FunctionDef, ast.Try)):
            heads = [getattr(s, f) for f in ("iter", "test") if hasattr(s, f)] + [i.context_expr for i in
                                                                                  getattr(s, "items", [])]
            return any(is_communication(n) for h in heads for n in ast.walk(h))
        return any(is_communication(n) for n in ast.walk(s))

    inner = [s for f in ("body", "orelse") for s in getattr(stmt, f, [])] if not isinstance(
        stmt, ast.FunctionDef) else []
    return direct(stmt) or any(direct(s) for s in inner)


def is_communication(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (call_name(node) in COMMUNICATION or call_name(node) == "wait")


def depends(a: ast.stmt, b: ast.stmt) -> bool:
    """True when one statement binds or deletes a name the other uses (swapping them is a NameError, or reads a
    value from the previous iteration: no learner's ordering mistake)."""
    def names(s, ctx):
        updated = {id(n.target) for n in ast.walk(s) if isinstance(n, ast.AugAssign)}  # `t /= n` reads t, binds none
        return {n.id for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)
                and id(n) not in updated}

    bound_a, bound_b = names(a, (ast.Store, ast.Del)), names(b, (ast.Store, ast.Del))
    return bool(bound_a & names(b, ast.Load) or bound_b & names(a, ast.Load) or bound_a & bound_b)
