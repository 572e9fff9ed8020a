"""The import statements of a learner's puzzle, held to the list of what it may import (puzzles/simulator/modules.py).

A static scan of the source before it is loaded, on both backends: every `import` and `from ... import`, at module
level and inside functions and classes; a relative import is read as the puzzles package's (`from .model import
forward` is puzzles.model). `__import__` named in the source is refused too (a computed name is the runtime's:
allowed.py's "import" audit event). One file costs one parse.

A puzzle file made from a notebook's cells holds every cell (grader/frontends/notebooks/cells.py): there the
puzzle's own cell is held whole, and the other cells only in what a rank runs (imports inside a function or a
class); a module-level import in another cell (matplotlib for a plot, numpy for an experiment) is the notebook's,
not the puzzle's, and is left to the denylist of internals (tamper.py) and the runtime's rules.
"""

from __future__ import annotations

import ast
import re

from puzzles.simulator.modules import ANY_PUZZLE, allowed_from, allowed_module, refusal

_CELL_HEADER = re.compile(r"^# ---- (.+) \(cell \d+ of .*\) ----$")


def refused_imports(source: str, filename: str = "<answer>", extras=ANY_PUZZLE, puzzle_id: str = "",
                    first_line: int = 1) -> list[str]:
    """One sentence per import outside the list ('p3_data_parallel.py:5 imports threading, which ...'); [] when
    every import is allowed (or the source does not parse: loading it reports that). `first_line`: the line of
    `filename` that `source` starts at (a function's source, out of a notebook's cell)."""
    from .learner_code import NOTEBOOK_MARK

    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        return []
    if first_line != 1:
        ast.increment_lineno(tree, first_line - 1)
    lines = source.splitlines()
    others = set()  # lines of a notebook's cells that are not the puzzle's own (their module-level imports pass)
    if lines and NOTEBOOK_MARK in lines[0]:
        mine = True
        for number, line in enumerate(lines, 1):
            header = _CELL_HEADER.match(line)
            if header:
                mine = header.group(1) == f"your {puzzle_id} cell"
            elif not mine:
                others.add(number)
    module_level = {id(node) for node in tree.body}
    for node in tree.body:  # statements nested in module-level if/try/with are module level too
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            module_level.update(id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
    found = []

    def note(node, module: str):
        if node.lineno in others and id(node) in module_level:
            return
        found.append(refusal(module, f"{filename}:{node.lineno}", extras))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not allowed_module(alias.name, extras):
                    note(node, alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: the puzzles package's (a puzzle file sits in puzzles/)
                module = "puzzles" + (f".{module}" if module else "") if node.level == 1 else f"..{module}"
            if not allowed_module(module, extras):
                note(node, module)
                continue
            for alias in node.names:
                if not allowed_from(module, alias.name, extras):
                    note(node, f"{module}.{alias.name}")
        elif isinstance(node, ast.Name) and node.id == "__import__":
            found.append(f"{filename}:{node.lineno} uses __import__, which a puzzle's code may not use (it imports "
                         f"by a computed name): write an import statement of a module the list allows "
                         f"(puzzles/simulator/modules.py).")
    return sorted(found, key=_line_of)


def refused_in_module(module, extras=ANY_PUZZLE, puzzle_id: str = "") -> list[str]:
    """refused_imports of a module's file, or (a notebook's namespace, graded by the check cell) of each function
    and class it defines, named by the file and line its code has (the cell's, which the check cell renames)."""
    import inspect
    import os
    import textwrap

    path = getattr(module, "__file__", None)
    if path and os.path.exists(path):
        with open(path) as f:
            return refused_imports(f.read(), os.path.basename(path), extras, puzzle_id)
    found = []
    own = {getattr(module, "__name__", None), "__main__"}
    for value in list(vars(module).values()):
        if (inspect.isfunction(value) or inspect.isclass(value)) and getattr(value, "__module__", None) in own:
            try:
                lines, first = inspect.getsourcelines(value)
                filename = inspect.getsourcefile(value) or "<notebook>"
            except (OSError, TypeError):
                continue
            found += refused_imports(textwrap.dedent("".join(lines)), filename, extras, puzzle_id, max(first, 1))
    return sorted(set(found), key=_line_of)


def _line_of(sentence: str) -> int:
    match = re.match(r"[^:]*:(\d+)", sentence)
    return int(match.group(1)) if match else 0


def screened(spec, source: str, filename: str, *, _scan=None, _imports=refused_imports):
    """What both backends say of a puzzle file's source before loading it: `tampered` where it names the grader's
    internals (tamper.py), `error` where it imports what the list refuses; None when it may be loaded."""
    from ..core.result import ERROR, TAMPERED, PuzzleResult
    from .tamper import describe_internals, internals_used

    found = (_scan or internals_used)(source, filename)
    if found:
        return PuzzleResult(spec.id, spec.name, spec.title, TAMPERED, error=describe_internals(found))
    refused = _imports(source, filename, spec.modules, spec.id)
    if refused:  # (before the import: a refused module's import-time code never runs)
        return PuzzleResult(spec.id, spec.name, spec.title, ERROR, error=describe_refused(refused))
    return None


def describe_refused(found: list[str]) -> str:
    """The result's error text: the first refusal, and how many more there are."""
    more = len(found) - 1
    return found[0] + (f" (and {more} more import{'s' if more > 1 else ''} outside the list)" if more else "")
