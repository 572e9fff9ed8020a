"""Which tests pytest-xdist must run on one worker: the files that mark themselves `xdist_group(...)`.

A file whose tests share an expensive module-scoped fixture (a batch run, a virtual environment, a gloo job)
marks itself `pytestmark = pytest.mark.xdist_group("name")` so that one worker computes the fixture once. xdist
honours the mark by appending "@name" to each test's node id on the worker, through `item._nodeid`; pytest 9.2
derives the node id from another field, so the suffix is silently lost there and every test became a work unit of
its own: the sandbox's 60-second batch run was made twice in one suite, on both workers (measured 2026-12-08,
pytest 9.2.0 with pytest-xdist 3.8.0).

So `pytest tests` schedules with this module's rule instead, which needs no help from the workers: the
controller reads each test file's module-level `pytestmark` (its source, not an import: the controller collects
nothing) and keeps a marked file's tests together, in one work unit named for the group; every other test is a
unit of its own, as xdist's loadgroup makes it. A mark on single tests or parameters still works where xdist's
suffix does and is harmless where it does not (each such test is a unit of its own either way).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def file_group(path: str) -> str | None:
    """The group a test file's module-level `pytestmark` names with `pytest.mark.xdist_group("...")`, or None."""
    try:
        tree = ast.parse(Path(path).read_text(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                for t in node.targets):
            for call in ast.walk(node.value):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "xdist_group" and call.args
                        and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
                    return call.args[0].value
    return None


def work_unit(nodeid: str, root: Path) -> str:
    """The work unit a test belongs to: its file's group, or the test itself. `root`: pytest's rootdir."""
    if "@" in nodeid.rpartition("]")[2]:  # xdist's own suffix, where pytest still keeps it
        return nodeid.rpartition("@")[2]
    group = file_group(str(root / nodeid.split("::", 1)[0]))
    return group or nodeid  # (a node id holds "::", a group name does not)


def make_scheduler(config, log):
    """xdist's scope scheduler, with a marked file's tests in one unit (see the module's docstring)."""
    from xdist.scheduler import LoadScopeScheduling

    root = Path(str(config.rootpath))

    class FileGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid, root)

    return FileGroupScheduling(config, log)
