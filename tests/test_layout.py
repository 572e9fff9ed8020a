"""The layout holds: no import cycle anywhere in puzzles/ or grader/, and the grader's layers import one way.

    puzzles (the learner's files, model.py, sim.py and the simulator)   imports nothing of the grader
    grader.core      spec, checks, results, comparison, report          may import puzzles
    grader.specs     one package per puzzle, and common/                may import core and puzzles
    grader.predictor `grader predict`: a step at scale on meta tensors  may import core and puzzles
    grader.backends  the simulator's runner, real torch.distributed     may import specs, core and puzzles
    grader.frontends CLI, notebook, plots, build, batch, ...            may import everything below

The graph is read from the source (every `import` and `from ... import`, inside functions too, since a lazy
import is still an arrow), leaving out imports under `if TYPE_CHECKING:`, which only type checkers follow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("puzzles", "grader")

# What each layer may import, by the first two parts of the module name ("grader.core", "puzzles", ...).
ALLOWED = {
    "puzzles": {"puzzles"},
    "grader.core": {"puzzles", "grader.core"},
    "grader.specs": {"puzzles", "grader.core", "grader.specs"},
    "grader.predictor": {"puzzles", "grader.core", "grader.predictor"},
    "grader.backends": {"puzzles", "grader.core", "grader.specs", "grader.backends"},
    "grader.frontends": {"puzzles", "grader.core", "grader.specs", "grader.predictor", "grader.backends",
                         "grader.frontends"},
}


def modules() -> dict[str, Path]:
    """'grader.core.spec' -> its file, for every module of the two packages."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every import node, skipping the bodies of `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (n for child in node.orelse for n in _imports_of(child))
            continue
        yield from _imports_of(node)


def _imports_of(node: ast.AST):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _imports(node)


def edges(name: str, path: Path, known: dict) -> set[str]:
    """The modules of the two packages that module `name` imports."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import sub` imports the module pkg.sub when there is one, else a name of pkg
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        for t in targets:
            while t and t not in known:  # `import puzzles.sim` names a module; `a.b.c` (a name) falls back to a.b
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: edges(name, path, known) for name, path in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "puzzles":
        return "puzzles"
    if len(parts) >= 2 and f"grader.{parts[1]}" in ALLOWED:
        return f"grader.{parts[1]}"
    return None  # grader/__init__, __main__ and the public shims (grader.notebook, grader.launch): the top


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "import cycles (each a set of modules that import each other in a circle):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_layers_import_one_way():
    wrong = []
    for module, targets in graph().items():
        mine = layer(module)
        for t in sorted(targets):
            if t.split(".")[0] not in PACKAGES:
                continue
            theirs = layer(t)
            if theirs is None:  # the top of grader (its map and the public shims): nothing imports it
                wrong.append(f"{module} imports {t}, the top of grader")
            elif mine is not None and theirs not in ALLOWED[mine]:
                wrong.append(f"{module} ({mine}) imports {t} ({theirs})")
    assert not wrong, "imports against the layers (core <- specs <- backends <- frontends):\n" + "\n".join(wrong)


SPEC_PACKAGES = sorted(p.name for p in (ROOT / "grader" / "specs").iterdir() if p.name[:1] == "p" and p.is_dir())


@pytest.mark.parametrize("folder", ["puzzles", "puzzles/simulator", "grader", "grader/core", "grader/specs",
                                    "grader/specs/common", "grader/predictor", *(f"grader/specs/{p}" for p in
                                                                                  SPEC_PACKAGES),
                                    "grader/backends", "grader/backends/real", "grader/frontends",
                                    "grader/frontends/batch", "grader/frontends/reports", "grader/frontends/notebooks",
                                    "grader/frontends/mutate", "grader/frontends/plots"])
def test_each_folder_opens_with_a_map(folder):
    init = ROOT / folder / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text())) if init.exists() else None
    assert doc and len(doc.splitlines()) >= 3, f"{folder}/__init__.py should open with a map of what lives where"


def test_each_puzzle_is_one_package_under_specs():
    """One puzzle, one place: grader/specs/pN_<name>/ for every puzzle the solutions hold, no flat pN_*.py beside
    them, and each package's SPEC is that puzzle's."""
    from grader.specs import SPECS

    specs = ROOT / "grader" / "specs"
    flat = sorted(p.name for p in specs.glob("p*.py"))
    assert not flat, f"a puzzle's spec is a package (grader/specs/pN_<name>/), not a flat module: {flat}"
    solutions = sorted(p.stem for p in (ROOT / "solutions").glob("p*_*.py"))
    assert SPEC_PACKAGES == sorted(solutions), (
        f"packages under grader/specs/ {SPEC_PACKAGES} against solutions/ {solutions}")
    ids = [name.split("_")[0] for name in SPEC_PACKAGES]
    assert len(set(ids)) == len(ids), f"a puzzle id with two packages: {sorted(ids)}"
    for name in SPEC_PACKAGES:
        assert (specs / name / "spec.py").exists(), f"grader/specs/{name}/ has no spec.py"
        assert SPECS[name.split("_")[0]].filename == f"{name}.py", name
