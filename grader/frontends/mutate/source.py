"""A solution file as the operators see it: its AST with parents, its solution regions, and edits on its text.

Operators never print a whole file back from the AST (that would drop every comment and change every line).
An edit replaces one span of the original text (an expression, a statement, a run of lines) and leaves the rest
byte for byte, so a mutant's diff shows only the mistake and its line numbers match the reference's.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass

from ..stubs import BEGIN, END


@dataclass(frozen=True)
class Edit:
    """One change to the text: the span from (line, column) to (line, column), columns in UTF-8 bytes as the AST
    gives them, becomes `text`. `deletes_line`: the first line of the span is gone (its mutant text is "")."""

    start: tuple[int, int]
    end: tuple[int, int]
    text: str
    description: str
    deletes_line: bool = False


@dataclass
class Mutant:
    """One mutated solution: which operator made it, what changed, and the whole mutated file."""

    puzzle: str
    operator: str
    description: str
    lineno: int  # in the reference, for people (the equivalents list never keys on it)
    line: str  # the reference's line, stripped
    mutant: str  # what that line became, stripped ("" when deleted)
    occurrence: int  # 1 for the first line of the file with this text, 2 for the next one, ...
    source: str
    diff: str

    @property
    def key(self) -> dict:
        return {"puzzle": self.puzzle, "operator": self.operator, "line": self.line, "mutant": self.mutant,
                "occurrence": self.occurrence}


def solution_regions(text: str) -> list[tuple[int, int]]:
    """The (first, last) line numbers strictly between each `# BEGIN SOLUTION` and `# END SOLUTION`."""
    regions, start = [], None
    for number, line in enumerate(text.splitlines(), 1):
        mark = line.strip()
        if mark == BEGIN:
            start = number + 1
        elif mark == END and start is not None:
            regions.append((start, number - 1))
            start = None
    return regions


class Source:
    """The reference's text, its AST (every node knows its parent) and its solution regions."""

    def __init__(self, text: str, filename: str = "<solution>"):
        self.text, self.filename = text, filename
        self.lines = text.splitlines(keepends=True)
        self.tree = ast.parse(text, filename)
        self.regions = solution_regions(text)
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        raw = text.encode()
        self._line_starts = [0]
        for b in raw.splitlines(keepends=True):
            self._line_starts.append(self._line_starts[-1] + len(b))
        self._raw = raw

    # ---- where things are

    def in_region(self, node: ast.AST) -> bool:
        first, last = node.lineno, getattr(node, "end_lineno", node.lineno)
        return any(a <= first and last <= b for a, b in self.regions)

    def nodes(self, kind=ast.AST):
        """Every node of `kind` that lies wholly inside a solution region, in source order."""
        found = [n for n in ast.walk(self.tree) if isinstance(n, kind) and hasattr(n, "lineno") and self.in_region(n)]
        return sorted(found, key=lambda n: (n.lineno, n.col_offset))

    def statement_of(self, node: ast.AST) -> ast.stmt:
        while not isinstance(node, ast.stmt):
            node = self.parent[node]
        return node

    def line_text(self, number: int) -> str:
        return self.lines[number - 1].strip() if 0 < number <= len(self.lines) else ""

    def segment(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.text, node) or ast.unparse(node)

    def whole_lines(self, stmt: ast.stmt) -> bool:
        """True when the statement has its lines to itself (nothing before it, only a comment after it)."""
        head = self._raw[self._line_starts[stmt.lineno - 1]:self._offset(stmt.lineno, stmt.col_offset)]
        tail = self._raw[self._offset(stmt.end_lineno, stmt.end_col_offset):self._line_starts[stmt.end_lineno]]
        return not head.strip() and (not tail.strip() or tail.strip().startswith(b"#"))

    def indent(self, number: int) -> str:
        line = self.lines[number - 1]
        return line[: len(line) - len(line.lstrip())]

    # ---- applying an edit

    def _offset(self, line: int, col: int) -> int:
        return self._line_starts[line - 1] + col

    def apply(self, edit: Edit) -> str:
        a, b = self._offset(*edit.start), self._offset(*edit.end)
        return (self._raw[:a] + edit.text.encode() + self._raw[b:]).decode()

    def occurrence(self, number: int) -> int:
        text = self.line_text(number)
        return 1 + sum(1 for n in range(1, number) if self.line_text(n) == text)

    def mutant(self, puzzle: str, operator: str, edit: Edit) -> Mutant | None:
        """The mutant an edit makes, or None when it is no mutant (the same text, or text that does not parse)."""
        text = self.apply(edit)
        if text == self.text:
            return None
        try:
            ast.parse(text)
        except SyntaxError:
            return None
        diff = "".join(difflib.unified_diff(self.lines, text.splitlines(keepends=True), self.filename,
                                            f"{self.filename} (mutant)", n=1))
        number = edit.start[0]
        after = "" if edit.deletes_line else text.splitlines()[number - 1].strip()
        return Mutant(puzzle, operator, edit.description, number, self.line_text(number), after,
                      self.occurrence(number), text, diff)

    # ---- the edits operators make

    def replace(self, node: ast.expr, new: ast.expr, description: str) -> Edit | None:
        """`node` becomes `new`. The smallest enclosing piece that can be printed back whole (a simple statement,
        or the header expression of a for/if/while/with) is printed from the AST with `new` in place, so operator
        precedence comes out right; everything outside it keeps its text."""
        root = self._printable_root(node)
        if root is None:
            return None
        holder = self.parent[node]
        field, index = _field_of(holder, node)
        _put(holder, field, index, new)
        try:
            text = ast.unparse(new if root is node else root)
        finally:
            _put(holder, field, index, node)
        return Edit((root.lineno, root.col_offset), (root.end_lineno, root.end_col_offset), text, description)

    def _printable_root(self, node: ast.AST):
        while True:
            holder = self.parent.get(node)
            if holder is None:
                return None
            if isinstance(node, ast.stmt):
                return node if not isinstance(node, _COMPOUND) and self.whole_lines(node) else None
            if isinstance(holder, (ast.For, ast.AsyncFor)) and node in (holder.iter, holder.target):
                return node
            if isinstance(holder, (ast.If, ast.While)) and node is holder.test:
                return node
            if isinstance(node, ast.withitem):
                return node.context_expr if node.optional_vars is None else None
            if isinstance(holder, ast.stmt) and isinstance(holder, _COMPOUND):
                return None  # a decorator, a default argument, ...: not a learner's expression
            node = holder

    def delete(self, stmt: ast.stmt, description: str) -> Edit | None:
        """The statement is gone (its lines, or `pass` when it is the only statement of its block)."""
        if not self.whole_lines(stmt):
            return None
        start, end = (stmt.lineno, 0), (stmt.end_lineno + 1, 0)
        holder = self.parent[stmt]
        field, _ = _field_of(holder, stmt)
        if len(getattr(holder, field)) == 1:
            return Edit(start, end, f"{self.indent(stmt.lineno)}pass\n", description, deletes_line=True)
        return Edit(start, end, "", description, deletes_line=True)

    def swap(self, first: ast.stmt, second: ast.stmt, description: str) -> Edit | None:
        """Two statements of one block change places (comments and blank lines between them stay between)."""
        if not (self.whole_lines(first) and self.whole_lines(second)):
            return None
        a = "".join(self.lines[first.lineno - 1:first.end_lineno])
        middle = "".join(self.lines[first.end_lineno:second.lineno - 1])
        b = "".join(self.lines[second.lineno - 1:second.end_lineno])
        return Edit((first.lineno, 0), (second.end_lineno + 1, 0), b + middle + a, description)

    def drop_with_item(self, stmt: ast.With, index: int, description: str) -> Edit | None:
        """One context manager of a `with` is gone; when it was the only one, so is the `with` line, and its body
        moves out one level."""
        items = stmt.items
        if len(items) > 1:
            rest = [self.segment(item.context_expr) + (f" as {self.segment(item.optional_vars)}"
                                                         if item.optional_vars else "")
                    for i, item in enumerate(items) if i != index]
            first, last = items[0].context_expr, items[-1].optional_vars or items[-1].context_expr
            return Edit((first.lineno, first.col_offset), (last.end_lineno, last.end_col_offset), ", ".join(rest),
                        description)
        body = stmt.body[0]
        if not self.whole_lines(stmt) or body.lineno != stmt.lineno + 1 or body.lineno > stmt.end_lineno:
            return None
        shift = len(self.indent(body.lineno)) - len(self.indent(stmt.lineno))
        moved = [line[shift:] if line[:shift].strip() == "" else line
                 for line in self.lines[body.lineno - 1:stmt.end_lineno]]
        return Edit((stmt.lineno, 0), (stmt.end_lineno + 1, 0), "".join(moved), description, deletes_line=True)


_COMPOUND = (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try, ast.FunctionDef,
             ast.AsyncFunctionDef, ast.ClassDef, ast.Match) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())


def _field_of(holder: ast.AST, node: ast.AST) -> tuple[str, int | None]:
    for field, value in ast.iter_fields(holder):
        if value is node:
            return field, None
        if isinstance(value, list):
            for i, item in enumerate(value):
                if item is node:
                    return field, i
    raise ValueError(f"{node!r} is not a child of {holder!r}")


def _put(holder: ast.AST, field: str, index: int | None, value: ast.AST) -> None:
    if index is None:
        setattr(holder, field, value)
    else:
        getattr(holder, field)[index] = value
