"""A puzzle's code may import only what is on the list (puzzles/simulator/modules.py): torch's public API,
puzzles.model, puzzles.sim's public names, a few standard modules, and per puzzle what its stub needs (p18's io,
zlib, json, hashlib). Read in the source before it is loaded (grader/backends/imports.py, both backends), and
refused at run time by the "import" audit event when a rank's own line imports a module not loaded yet."""

import sys
from pathlib import Path

import nbformat
import pytest

from grader.backends.imports import refused_imports
from grader.backends.simulator import grade_file
from grader.core.result import ERROR, PASS
from grader.frontends.notebooks.cells import notebook_target
from grader.specs import SPECS
from puzzles import sim
from puzzles.simulator import modules

ROOT = Path(__file__).resolve().parent.parent
P3_BODY = (ROOT / "solutions" / "p3_data_parallel.py").read_text()


def scan(source: str, puzzle: str = "p3") -> list[str]:
    return refused_imports(source, SPECS[puzzle].filename, SPECS[puzzle].modules, puzzle)


REFUSED = {
    "top level": ("import threading\n", "threading", 1),
    "inside a function": ("def f():\n    import subprocess\n    return subprocess\n", "subprocess", 2),
    "from x import y": ("from os import path\n", "os", 1),
    "a submodule": ("import multiprocessing.pool\n", "multiprocessing.pool", 1),
    "numpy": ("import numpy as np\n", "numpy", 1),
    "pickle": ("import pickle\n", "pickle", 1),
    "builtins": ("import builtins\n", "builtins", 1),
    "sys": ("x = 1\nimport sys\n", "sys", 2),
    "io outside p18": ("import io\n", "io", 1),
    "a private torch module": ("import torch.utils._pytree\n", "torch.utils._pytree", 1),
    "a private torch name": ("from torch.nn import _reduction\n", "torch.nn._reduction", 1),
    "a private name of puzzles.sim": ("from puzzles.sim import _active\n", "puzzles.sim._active", 1),
    "another module of puzzles": ("from puzzles import p1_checkpointing\n", "puzzles.p1_checkpointing", 1),
    "a relative import": ("from .simulator import world\n", "puzzles.simulator", 1),
    "inside a class": ("class A:\n    import socket\n", "socket", 2),
    "under a try": ("try:\n    import numpy\nexcept ImportError:\n    pass\n", "numpy", 2),
}


@pytest.mark.parametrize("how", sorted(REFUSED))
def test_an_import_off_the_list_is_refused_with_its_name_and_line(how):
    source, module, line = REFUSED[how]
    found = scan(source)
    assert len(found) == 1, found
    assert found[0].startswith(f"p3_data_parallel.py:{line} imports {module}, which a puzzle's code may not import")


def test_the_sentence_names_the_module_the_line_why_and_what_to_use():
    (sentence,) = scan("import torch\n\n\ndef step(dist):\n    import threading\n")
    assert sentence == (
        "p3_data_parallel.py:5 imports threading, which a puzzle's code may not import (it starts threads or "
        "processes, whose work the rank's clock and memory ledger never see): do the work in the rank's own code, "
        "and overlap communication with async_op=True and wait() (what may be imported: "
        "puzzles/simulator/modules.py).")
    assert sentence.count(". ") == 0  # one sentence


def test_dunder_import_by_name_is_refused():
    (sentence,) = scan("def f(name):\n    return __import__(name)\n")
    assert sentence.startswith("p3_data_parallel.py:2 uses __import__")


def test_the_internals_stay_on_the_denylist_first():
    """torch._C, the dispatcher's insides, the grader: still refused as internals (status tampered), before the list
    is read."""
    from grader.backends.tamper import internals_used

    for source in ("import torch._C\n", "import torch.utils._python_dispatch\n", "import grader\n",
                   "import importlib\n", "import ctypes\n"):
        assert internals_used(source), source


HONEST = [f"import {m}\n" for m in modules.STANDARD if m != "__future__"] + [
    "from __future__ import annotations\n",
    "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\nimport torch.distributed as dist\n",
    "import torch.autograd\nfrom torch.autograd import Function\nimport torch.utils.checkpoint\n",
    "from torch.utils.data import Subset\nimport torch.jit\n",
    "from puzzles.model import forward, loss_fn\nfrom puzzles.sim import cuda\nfrom puzzles import sim, model\n",
    "import puzzles.sim\nfrom puzzles.sim import DataLoader, TensorDataset\n",
    "from .model import forward\nfrom . import sim\n",
    "import logging\nlog = logging.getLogger(__name__)\n\ndef helper(x):\n    log.info('x %s', x)\n",
    "from collections.abc import Sequence\nfrom datetime import timedelta\nimport logging.handlers\n",
]


@pytest.mark.parametrize("source", HONEST)
def test_what_is_on_the_list_passes(source):
    assert scan(source) == []


def test_p18_may_import_what_its_checkpoints_need_and_only_p18():
    source = "import io\nimport zlib\nimport json\nimport hashlib\nimport struct\n"
    assert scan(source, "p18") == []
    assert len(scan(source, "p3")) == 5


def test_every_puzzles_extras_are_the_runtime_list_outside_a_grading_run():
    declared = {m for spec in SPECS.values() for m in spec.modules}
    assert declared == set(modules.ANY_PUZZLE)


def test_every_honest_answer_imports_only_what_the_list_allows():
    for folder in ("solutions", "tests/alternatives", "tests/naive", "puzzles"):
        for path in sorted((ROOT / folder).glob("p*_*.py")):
            spec = SPECS.get(path.stem.split("_")[0])
            if spec is not None:
                assert refused_imports(path.read_text(), path.name, spec.modules, spec.id) == [], path


def test_a_refused_file_is_not_loaded_and_its_result_says_why(tmp_path):
    path = tmp_path / "p3_data_parallel.py"
    path.write_text("import numpy\nraise SystemExit('loaded')\n" + P3_BODY)
    result = grade_file(SPECS["p3"], path, seed=0)
    assert result.status == ERROR
    assert result.error.startswith("p3_data_parallel.py:1 imports numpy")


def test_a_module_imported_by_a_computed_name_while_a_run_is_on_is_refused():
    name = "xml.dom.pulldom"
    if name in sys.modules:
        pytest.skip(f"{name} is loaded already: the import event does not fire")

    def fn(dist):
        return __import__(".".join(["xml", "dom", "pulldom"])) and 1

    with pytest.raises(sim.ImportRefusedError, match=r"rank 0 at .*test_allowed_modules.py:\d+.* imports "
                                                     r"xml\.dom\.pulldom, which a puzzle's code may not import"):
        sim.run(fn, world_size=1)
    assert name not in sys.modules
    assert issubclass(sim.ImportRefusedError, ImportError)  # code that falls back on a missing module runs on


def test_a_module_on_the_list_imported_at_run_time_passes_and_libraries_import_what_they_need():
    def fn(dist):
        import fractions  # noqa: F401 (on the list)
        import torch

        torch.jit.script(lambda_free)  # torch's own lazy imports are torch's lines
        return 1

    assert sim.run(fn, world_size=1).results == [1]


def lambda_free(x):
    return x * 2


def _notebook(tmp_path, p3_source: str) -> Path:
    cells = [nbformat.v4.new_code_cell("import matplotlib\nimport numpy as np\nprint(np.arange(3))\n"),
             nbformat.v4.new_code_cell(p3_source)]
    cells[1].metadata["tags"] = ["p3"]
    path = tmp_path / "mine.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), str(path))
    return path


def test_a_notebook_whose_other_cell_imports_matplotlib_still_grades(tmp_path):
    with notebook_target(_notebook(tmp_path, P3_BODY)) as target:
        result = grade_file(SPECS["p3"], target / SPECS["p3"].filename, seed=0)
    assert result.status == PASS, result.error


def test_a_notebooks_puzzle_cell_is_held_to_the_list_and_named(tmp_path):
    nb = notebook_target(_notebook(tmp_path, "import threading\n" + P3_BODY))
    with nb as target:
        result = nb.extracted.relocate(grade_file(SPECS["p3"], target / SPECS["p3"].filename, seed=0))
    assert result.status == ERROR
    assert result.error.startswith("your p3 cell, line 1 imports threading"), result.error


def test_a_notebooks_other_cell_is_held_in_what_a_rank_runs(tmp_path):
    path = _notebook(tmp_path, P3_BODY)
    nb = nbformat.read(str(path), as_version=4)
    nb.cells.insert(1, nbformat.v4.new_code_cell("def helper():\n    import subprocess\n    return subprocess\n"))
    nbformat.write(nb, str(path))
    with notebook_target(path) as target:
        found = refused_imports((target / SPECS["p3"].filename).read_text(), SPECS["p3"].filename, (), "p3")
    assert len(found) == 1 and "imports subprocess" in found[0], found


def test_the_notebooks_check_cell_holds_its_functions_to_the_list_and_names_their_line(tmp_path):
    """`check("p3")` in a notebook grades the namespace: the imports its functions make are read, where they are."""
    import types

    from grader.backends.simulator import grade_module

    source = P3_BODY.replace("    loss = loss_fn(", "    import threading\n    loss = loss_fn(", 1)
    path = tmp_path / "cell.py"
    path.write_text(source)
    namespace = {"__name__": "__main__"}
    exec(compile(source, str(path), "exec"), namespace)
    module = types.ModuleType("notebook_p3")
    module.__dict__.update({k: v for k, v in namespace.items() if not k.startswith("__")})
    result = grade_module(SPECS["p3"], module, seed=0)
    line = source.splitlines().index("    import threading") + 1
    assert result.status == ERROR and result.error.startswith(f"{path}:{line} imports threading"), result.error
