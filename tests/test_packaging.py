"""The package as pip installs it, not as the checkout runs it: build the wheel, install it (not editable) into a
fresh virtual environment, and grade from a folder outside the repository: a copy of the stubs (as ./puzzles), a
copy of the solutions, and the notebook. An editable install hides a wheel that leaves out a subpackage; this
test does not.

The fresh environment borrows torch, numpy, matplotlib and nbformat from the running interpreter's site-packages
(tests/isolated.py), so the project itself can come only from the wheel; the test checks that it does.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import zipfile

from isolated import fresh_venv, run

from grader.frontends.targets import REPO
from grader.specs import SPECS

ALL = len(SPECS)


def can_build_here() -> bool:
    """Whether this interpreter can build the wheel itself, with no download: setuptools 77 or newer (it builds
    wheels on its own, and reads the license as pyproject.toml writes it)."""
    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(part) for part in setuptools.__version__.split(".")[:2] if part.isdigit())
    return version >= (77, 0)  # pyproject's build-system: the license as an SPDX string


def build_wheel(tmp_path):
    """The wheel, built from a copy of what a clone holds (so that nothing built before, say a stale build/,
    leaks in)."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("puzzles", "grader"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    isolation = ["--no-build-isolation"] if can_build_here() else []  # offline when it can be
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", str(tmp_path / "dist"),
                    str(src)], check=True, capture_output=True, text=True)
    [wheel] = (tmp_path / "dist").glob("training_puzzles-*.whl")
    return wheel


def grade(python, cwd, *args):
    proc = run(python, "-m", "grader", "check", *args, "--json", "--seed", "4", cwd=cwd)
    return proc, [p["status"] for p in json.loads(proc.stdout)["puzzles"]] if proc.stdout.strip() else []


def test_the_wheel_grades_stubs_solutions_and_the_notebook_outside_the_repository(tmp_path):
    wheel = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = sorted(p.parent.relative_to(REPO).as_posix() for top in ("puzzles", "grader")
                      for p in (REPO / top).rglob("__init__.py"))
    assert all(f"{p}/__init__.py" in names for p in packages), sorted(set(packages) - {n.rsplit("/", 1)[0] for n in names})
    assert not any(n.startswith(("solutions/", "tests/")) for n in names)
    [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
    requires = [line for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    assert "Requires-Dist: pytest" in requires, requires  # no `extra ==` marker: `pip install .` brings it

    python = fresh_venv(tmp_path / "venv")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, capture_output=True, text=True)
    work = tmp_path / "work"
    (work / "puzzles").mkdir(parents=True)
    for solution in sorted((REPO / "solutions").glob("p*_*.py")):
        shutil.copy(REPO / "puzzles" / solution.name, work / "puzzles")  # the stubs a learner starts from
    shutil.copytree(REPO / "solutions", work / "answers")
    shutil.copy(REPO / "puzzles.ipynb", work)
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=work).stdout.strip()
    where = run(python, "-c", "import grader, puzzles.sim, grader.specs; print(grader.__file__, puzzles.sim.__file__)",
                cwd=work, check=True).stdout.split()
    assert all(path.startswith(site) for path in where), (where, site)  # from the wheel, not the checkout

    proc, statuses = grade(python, work)  # 'puzzles' is ./puzzles
    assert proc.returncode == 0 and statuses == ["not_attempted"] * ALL, proc.stderr
    proc, statuses = grade(python, work, "answers")
    assert proc.returncode == 0 and statuses == ["pass"] * ALL, proc.stdout[-2000:] + proc.stderr
    proc, statuses = grade(python, work, "puzzles.ipynb")
    assert proc.returncode == 0 and statuses == ["not_attempted"] * ALL, proc.stderr

    (work / "puzzles").rename(work / "elsewhere")  # no ./puzzles, and no checkout to fall back on
    proc, _ = grade(python, work)
    assert proc.returncode == 2 and "installed package" in proc.stderr and "python -m grader check FOLDER" in proc.stderr
    proc = run(python, "-m", "grader", "build", cwd=work)
    assert proc.returncode == 2 and "not a checkout" in proc.stderr


def test_pip_install_brings_pytest_and_the_metadata_reads_without_a_deprecation():
    """Learners self-grade with plain `pytest` right after the README's first command, `pip install -e .`: pytest
    is a dependency of the package itself, not of an extra. And setuptools reads pyproject.toml without a
    deprecation warning (the license as a table stops being accepted on 2027-02-18: a Gradescope image built
    after that would fail in setup.sh)."""
    import tomllib
    import warnings

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "pytest" in pyproject["project"]["dependencies"]
    assert any(c.startswith("pip install -e . ") for _, c in quickstart_commands())  # no extra needed for pytest
    from setuptools.config import pyprojecttoml
    from setuptools.dist import Distribution

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pyprojecttoml.apply_configuration(Distribution(), REPO / "pyproject.toml")
    assert [str(w.message)[:120] for w in caught if "Deprecat" in w.category.__name__] == []


CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def quickstart_commands() -> list[tuple[str, str]]:
    """(the comment above it, the command) for each command of the README's Quickstart block."""
    block = (REPO / "README.md").read_text().split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    out, said = [], []
    for line in block.splitlines():
        if line.startswith("#"):
            said.append(line.lstrip("# "))
        elif line.strip():
            out.append((" ".join(said), line.strip()))
            said = []
    return out


def test_the_first_install_line_takes_the_cpu_torch_and_another_keeps_an_installed_torch():
    """Issue 30: the first line a learner copies was `pip install -e .`, which on Linux with no torch resolves
    `torch>=2.2` to the CUDA build (several GB); the CPU build was an aside two paragraphs later. Now every line
    that starts from a fresh environment installs the CPU build first, on the line itself, one line serves an
    environment that has torch already (Colab's), and each says whom it is for."""
    commands = quickstart_commands()
    first_said, first = commands[0]
    assert first.startswith("python3 -m venv") and CPU_TORCH in first, first
    assert first.index(CPU_TORCH) < first.index("pip install -e ."), first  # torch first: pip then keeps it
    assert "CPU" in first_said and "GPU" in first_said, first_said  # why this build: the puzzles need no GPU
    fresh = [c for _, c in commands if "-m venv" in c]
    assert fresh and all(CPU_TORCH in c and c.index(CPU_TORCH) < c.index("pip install -e") for c in fresh), fresh
    keeps = [(said, c) for said, c in commands if c.startswith("pip install -e . ")]
    assert keeps and "Colab" in keeps[0][0] and "already installed" in keeps[0][0], keeps
    assert all(said for said, _ in commands), commands  # each line says whom it is for
    import tomllib

    torch_requirement = [d for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
                         if d.startswith("torch")]
    assert torch_requirement == ["torch>=2.2"]  # a loose range: the index is the install line's choice, not ours
