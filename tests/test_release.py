"""`python -m grader release OUT` (grader/frontends/release.py): the copy a class receives has the stubs, the
notebook, the self-grading tests, the package and a learner's README; nothing of solutions/; and its own
`python -m grader` and `pytest` work in it, with no solutions/ anywhere."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from grader.frontends import build, cli, release
from grader.frontends.targets import REPO
from grader.specs import SPECS

pytestmark = pytest.mark.xdist_group("release")  # one xdist worker: its module-scoped release

SOLVED = "p3_data_parallel.py"


@pytest.fixture(scope="module")
def instructor(tmp_path_factory):
    """An instructor's repository whose puzzles/ holds a solved p3 (it must not ship)."""
    root = tmp_path_factory.mktemp("instructor")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("grader", "puzzles", "solutions", "tests/naive", "bench"):
        shutil.copytree(REPO / folder, root / folder, ignore=ignore)
    for name in ("README.md", "pyproject.toml", "conftest.py", "tests/conftest.py", "tests/test_puzzles.py",
                 "tests/test_cli.py"):
        shutil.copy(REPO / name, root / name)
    shutil.copy(REPO / "solutions" / SOLVED, root / "puzzles" / SOLVED)
    return root


@pytest.fixture(scope="module")
def copy(instructor, tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "class"
    release.write_release(instructor, out)
    return out


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_copy_holds_what_a_learner_needs_and_nothing_else(instructor, copy):
    files = files_of(copy)
    top = {name.split("/")[0] for name in files}
    assert top == {"README.md", "grader", "puzzles", "puzzles.ipynb", "puzzles-standalone.ipynb", "pyproject.toml",
                   "conftest.py", "tests", ".gitignore", "bench"}
    assert all(n.startswith("bench/") and n.endswith(".md") for n in files if n.startswith("bench"))  # records only
    assert ".venv/" in files[".gitignore"].decode().splitlines()  # a learner's commits leave their venv out
    assert not any(n.startswith("grader/frontends/mutate/") for n in files)  # the instructor's tool and its data
    assert sorted(n for n in files if n.startswith("tests/")) == ["tests/conftest.py", "tests/test_puzzles.py"]
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in files)
    for path, text in build.planned_files(instructor).items():  # generated, not the instructor's solved p3
        assert files[f"puzzles/{path.name}"].decode() == text
    assert files["puzzles.ipynb"].decode() == build.notebook_text(build.fresh_notebook(instructor))
    standalone = build.notebook_text(build.fresh_notebook(instructor, standalone=True))
    assert files["puzzles-standalone.ipynb"].decode() == standalone
    assert files["puzzles/sim.py"] == (REPO / "puzzles" / "sim.py").read_bytes()
    assert files["grader/frontends/cli.py"] == (REPO / "grader" / "frontends" / "cli.py").read_bytes()


def sources(name: str, data: bytes) -> list[str]:
    if name.endswith(".ipynb"):
        return [c.source for c in nbformat.reads(data.decode(), as_version=4).cells]
    return [data.decode(errors="replace")]


def squeeze(text: str) -> str:
    """Code without indentation, blank lines or comments: a region pasted at any depth still matches."""
    lines = (line.strip() for line in text.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("#"))


def test_nothing_of_solutions_is_in_the_copy(instructor, copy):
    files = files_of(copy)
    solution_bytes = {p.read_bytes() for p in (instructor / "solutions").glob("*.py")}
    assert not solution_bytes & set(files.values())
    texts = {name: squeeze("\n".join(sources(name, data))) for name, data in files.items()}
    markers = [n for n, data in files.items() for s in sources(n, data)
               if re.search(r"^\s*# (BEGIN|END) SOLUTION\s*$", s, re.M)]
    assert not markers
    for name, regions in release.solution_regions(instructor).items():
        for region in regions:
            if len(region) >= release.WINDOW:
                code = "\n".join(region)
                assert not [n for n, text in texts.items() if code in text], f"{name}'s reference is in the copy"
    assert release.solution_leaks(files, instructor) == []


def test_the_leak_finder_finds_a_pasted_solution(instructor):
    p8 = (instructor / "solutions" / "p8_zero.py").read_text()
    body = "\n".join("        " + line for line in p8.split("# BEGIN SOLUTION", 1)[1].splitlines()[1:8])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1\n    # BEGIN SOLUTION\n")])
    shared = "for i, (w1, w2) in enumerate(layers):\n    if i % k == 0:\n"
    leaks = release.solution_leaks({"a.py": (instructor / "solutions" / SOLVED).read_bytes(),
                                    "grader/helper.py": f"def f():\n{body}\n", "n.ipynb": nbformat.writes(nb),
                                    "fine.py": shared}, instructor)
    assert any(leak.startswith("a.py is a file of solutions/") for leak in leaks)
    assert any(leak.startswith("grader/helper.py has the code of solutions/p8_zero.py") for leak in leaks)
    assert any(leak.startswith("n.ipynb has a '# BEGIN SOLUTION' line") for leak in leaks)
    assert not any(leak.startswith("fine.py") for leak in leaks)  # two lines the spec shares with p1: ordinary


def test_a_release_that_would_leak_is_refused_and_writes_nothing(instructor, tmp_path):
    leaky = tmp_path / "leaky"
    shutil.copytree(instructor, leaky)
    shutil.copy(leaky / "solutions" / "p7_overlap.py", leaky / "grader" / "reference_p7.py")
    with pytest.raises(ValueError, match="grader/reference_p7.py is a file of solutions/"):
        release.write_release(leaky, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_learner_readme_has_the_learner_sections_only():
    readme, unknown = release.learner_readme((REPO / "README.md").read_text())
    headings = re.findall(r"(?m)^## (.+)$", readme)
    assert headings == [h for h in re.findall(r"(?m)^## (.+)$", (REPO / "README.md").read_text())
                        if h in release.LEARNER_SECTIONS]
    assert unknown == [], (f"README sections neither release.LEARNER_SECTIONS nor INSTRUCTOR_SECTIONS name (they "
                           f"are left out of the learner's README): {unknown}")
    assert "For instructors" not in readme and "solutions/" not in readme and "BEGIN SOLUTION" not in readme
    assert "check solutions" not in readme and release.COPY_NOTE in readme
    assert "## Quickstart" in readme and "`dist` offers" in readme and "## What to hand in" in readme
    assert '.[dev]' not in readme and "pytest tests" not in readme and "docs/" not in readme  # nothing for developers


MIN_LENGTH = 24  # shorter lines of a region (`loss.backward()`, `else:`) are everyone's code
# Lines of solution regions that the package holds by design, each with its reason. Anything else found is a leak.
SHARED = {
    "world = dist.get_world_size()": "any distributed program's first line, as torch.distributed spells it (p18's "
                                     "harness asks it too)",
    "for i, (w1, w2) in enumerate(layers):": "p1's spec: the serial reference walks the blocks as the answer does; "
                                              "release.py's comment quotes it for that reason",
    "return tp + T * dp + T * D * pp": "p11's layout, rank = tp + 2·dp + 4·pp, which the puzzle's text states",
    "q, k, v = (x @ wqkv).split(d, dim=-1)": "model.py's causal_attention, which every learner reads, splits the "
                                             "projections as p15's answer does",
    "w.grad = torch.zeros_like(w)": "a weight whose gradient is never written gets zeros, as in p17's costs and "
                                    "the grader's explanation of a hang; p20's fix keeps its ranks' calls equal so",
}


def normalized(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def readable(name: str, data) -> str:
    """What a learner reads in a file: a notebook's cells, any other file's text."""
    data = data if isinstance(data, bytes) else data.encode()
    return "\n".join(sources(name, data))


def distinctive_lines(root: Path) -> dict[str, str]:
    """{line: its solution file} for every line of a solution region of MIN_LENGTH or more characters that the
    stubs (stories included) do not show anyway."""
    stubs = normalized("\n".join(build.planned_files(root).values()))
    return {normalized(line): name for name, regions in release.solution_regions(root).items()
            for region in regions for line in region
            if len(normalized(line)) >= MIN_LENGTH and normalized(line) not in stubs}


def solution_lines_in(files: dict, root: Path) -> list[str]:
    lines = distinctive_lines(root)
    found = []
    for name, data in release.unpacked(files).items():
        text = normalized(readable(name, data))
        found += [f"{name}: {line!r} (solutions/{where})" for line, where in lines.items()
                  if line in text and line not in SHARED]
    return found


def test_no_distinctive_line_of_a_solution_ships_in_the_copy_the_bundle_or_the_embedded_package(instructor, copy):
    """equivalents.py (the reviewed mutants of `grader mutate`) quoted p6's schedule, p11's layout, ...: a learner
    could read parts of the answers in the release, the Gradescope bundle and the standalone notebook's package."""
    from grader.frontends.notebooks.standalone import package_files as embedded
    from grader.frontends.reports.gradescope_bundle import bundle_files

    assert len(distinctive_lines(instructor)) > 150  # the check looks at most of each answer
    assert solution_lines_in(files_of(copy), instructor) == []
    assert solution_lines_in(bundle_files(instructor, {}, "2.13.0"), instructor) == []
    assert solution_lines_in(embedded(), instructor) == []


def test_the_line_finder_finds_the_instructors_mutants(instructor):
    equivalents = instructor / "grader" / "frontends" / "mutate" / "equivalents.py"
    found = solution_lines_in({"grader/frontends/mutate/equivalents.py": equivalents.read_bytes()}, instructor)
    assert len(found) > 10 and any("p6_one_f_one_b.py" in f for f in found), found


def test_the_copys_build_and_help_say_what_they_are(copy, tmp_path):
    own = tmp_path / "class"
    shutil.copytree(copy, own)
    proc = run_in(own, "-m", "grader", "build")
    assert proc.returncode == 2 and "build is the instructor's" in proc.stderr and "puzzles/" in proc.stderr
    listed = run_in(own, "-m", "grader", "--help").stdout
    assert "mutate" not in listed and "check" in listed


def run_in(folder: Path, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(folder)
    return subprocess.run([sys.executable, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def test_the_copy_grades_itself(copy, tmp_path):
    own = tmp_path / "class"
    shutil.copytree(copy, own)
    where = run_in(own, "-c", "import grader, puzzles; print(grader.__file__); print(puzzles.__file__)")
    assert where.stdout.split() == [str(own / "grader" / "__init__.py"), str(own / "puzzles" / "__init__.py")]
    scoreboard = run_in(own, "-m", "grader")
    assert scoreboard.returncode == 0, scoreboard.stderr
    n = len(SPECS)
    assert f"0 passed, 0 failed, 0 errors, {n} not attempted" in scoreboard.stdout
    tests = run_in(own, "-m", "pytest", "-q", "-p", "no:cacheprovider")
    assert tests.returncode == 0 and f"{n} skipped" in tests.stdout, tests.stdout + tests.stderr
    shutil.copy(REPO / "solutions" / SOLVED, own / "puzzles" / SOLVED)
    tests = run_in(own, "-m", "pytest", "-q", "-p", "no:cacheprovider")
    assert tests.returncode == 0 and f"1 passed, {n - 1} skipped" in tests.stdout, tests.stdout + tests.stderr


def test_the_command_writes_a_copy_once(tmp_path, capsys):
    assert cli.main(["release", str(tmp_path / "class")]) == 0
    assert "files to" in capsys.readouterr().err
    assert (tmp_path / "class" / "puzzles.ipynb").exists() and not (tmp_path / "class" / "solutions").exists()
    assert cli.main(["release", str(tmp_path / "class")]) == 2
    assert "not empty" in capsys.readouterr().err


def test_a_release_needs_the_instructors_repository(copy, tmp_path):
    with pytest.raises(FileNotFoundError, match="no solutions/"):
        release.write_release(copy, tmp_path / "again")


def test_every_path_the_learner_reads_of_is_in_the_copy(copy):
    """The released README cited bench/CORPUS.md, bench/CALIBRATION.md and bench/SCALE.md, and the copy had no
    bench/ (issue 30). Every path its README, its stories and its notebooks' text name opens in the copy."""
    files = files_of(copy)
    named = release.named_paths(files)
    assert {"bench/CORPUS.md", "bench/CALIBRATION.md", "bench/SCALE.md", "puzzles/simulator/collectives.py"} <= set(named)
    missing = {path: where for path, where in named.items() if path not in files}
    assert missing == {}, f"named in the copy, not in it: {missing}"
    assert files["bench/CORPUS.md"] == (REPO / "bench" / "CORPUS.md").read_bytes()


def test_a_readme_that_cites_a_missing_record_is_refused(instructor, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(instructor, broken)
    readme = broken / "README.md"
    readme.write_text(readme.read_text().replace("bench/CORPUS.md", "bench/NO_SUCH_RECORD.md", 1))
    with pytest.raises(FileNotFoundError, match="NO_SUCH_RECORD.md"):
        release.write_release(broken, tmp_path / "out")
    assert not (tmp_path / "out").exists()
