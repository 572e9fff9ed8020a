"""`python -m grader gradescope OUT`: the autograder bundle to upload to Gradescope (OUT/ and OUT.zip).

    OUT/setup.sh          Gradescope runs it once, as root, when it builds the image: a venv with the CPU build of
                          torch and this package
    OUT/run_autograder    Gradescope runs it for each submission: grades AUTOGRADER_ROOT/submission and writes
                          AUTOGRADER_ROOT/results/results.json (gradescope.autograde)
    OUT/autograder.json   the settings: time limits (a puzzle's, the submission's), the memory limit, puzzles,
                          weights (with each test's visibility and the leaderboard), visibility
    OUT/grader/, OUT/puzzles/, OUT/pyproject.toml, OUT/README.md
                          the package, as the student release has it (release.package_files): no solutions/,
                          which would sit in the container beside the learner's code

Gradescope unpacks the zip into /autograder/source and copies run_autograder to /autograder/run_autograder. Every
path moves with the environment (AUTOGRADER_ROOT, default /autograder; AUTOGRADER_PYTHON, default the venv's
python), so the same scripts run on any machine: tests/test_gradescope.py runs run_autograder in a temporary
folder on a solved, a stub and a naive submission and checks the results.json.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from .gradescope import CONFIG, VISIBILITY
from ..release import package_files
from .scoring import parse_weights, read_weights_file

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (written by `python -m grader
# gradescope`): a virtual environment with the CPU build of torch and the puzzles' package.
#   AUTOGRADER_ROOT    where Gradescope's folders live (default /autograder)
#   TORCH_INDEX_URL    where torch comes from (default: PyTorch's CPU wheels; empty: pip's own index)
set -euo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
SOURCE="$ROOT/source"
VENV="$ROOT/venv"
TORCH_INDEX_URL="${{TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}}"
if ! python3 -m venv --clear "$VENV" 2>/dev/null; then
    apt-get update && apt-get install -y python3 python3-venv python3-pip
    python3 -m venv --clear "$VENV"
fi
"$VENV/bin/python" -m pip install --upgrade pip
"$VENV/bin/python" -m pip install "torch=={torch}" ${{TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}}
"$VENV/bin/python" -m pip install "$SOURCE"
# A smoke test while the image is built: the stubs grade as "not attempted".
cd "$ROOT" && PYTHONPATH="$SOURCE" "$VENV/bin/python" -m grader check "$SOURCE/puzzles" -p p1
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for each submission (written by `python -m grader gradescope`): it grades
# $AUTOGRADER_ROOT/submission (puzzle files, a repository holding puzzles/, or a notebook), the learner's code in a
# process of its own with time and memory limits, and writes $AUTOGRADER_ROOT/results/results.json.
#   AUTOGRADER_ROOT    where Gradescope's folders live (default /autograder): source/, submission/, results/
#   AUTOGRADER_PYTHON  the Python that setup.sh prepared (default $AUTOGRADER_ROOT/venv/bin/python, else python3)
set -u
export AUTOGRADER_ROOT="${AUTOGRADER_ROOT:-/autograder}"
SOURCE="$AUTOGRADER_ROOT/source"
PYTHON="${AUTOGRADER_PYTHON:-$AUTOGRADER_ROOT/venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
RESULTS="$AUTOGRADER_ROOT/results/results.json"
mkdir -p "$AUTOGRADER_ROOT/results"
cd "$AUTOGRADER_ROOT"
# The bundle's own package comes first on the path, whatever else is installed.
PYTHONPATH="$SOURCE" "$PYTHON" -c 'import sys; from grader.frontends.reports.gradescope import autograde; sys.exit(autograde())'
if [ ! -s "$RESULTS" ]; then  # Python itself failed to start: still give Gradescope a result
    echo '{"score": 0, "output": "The autograder failed to start; your instructor has its log.", "tests": []}' \
        > "$RESULTS"
fi
"""

EXECUTABLE = ("setup.sh", "run_autograder")


def bundle_files(root: Path, config: dict, torch_version: str) -> dict[str, str | bytes]:
    files = package_files(root)
    files["setup.sh"] = SETUP.format(torch=torch_version)
    files["run_autograder"] = RUN
    files[CONFIG] = json.dumps(config, indent=1) + "\n"
    return files


def write_bundle(root: Path, out: Path, weights_path=None, puzzle_timeout: float = 60.0, memory_mb: int = 4096,
                 puzzle_ids=None, visibility: str = "visible", stdout_visibility: str = "hidden",
                 torch_version: str | None = None, submission_timeout: float | None = 540.0) -> tuple[Path, Path]:
    """Write OUT/ and OUT.zip (setup.sh and run_autograder at the zip's root, as Gradescope wants them); OUT's
    parents are made, as `release` makes its own."""
    out = Path(out)
    archive = out.with_name(out.name + ".zip")
    for path in (out, archive):
        if path.exists() and (path.is_file() or any(path.iterdir())):
            raise FileExistsError(f"{path} exists: give a new name")
    for v in (visibility, stdout_visibility):
        if v not in VISIBILITY:
            raise ValueError(f"visibility {v!r}: expected one of {', '.join(VISIBILITY)}")
    weights = read_weights_file(Path(weights_path)) if weights_path else {}
    parse_weights(weights, str(weights_path))  # refuse a bad file now, not in every learner's results
    if torch_version is None:
        import torch

        torch_version = torch.__version__.split("+")[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    config = {"puzzle_timeout": puzzle_timeout, "submission_timeout": submission_timeout, "memory_mb": memory_mb,
              "puzzles": list(puzzle_ids or []) or None,
              "weights": weights, "visibility": visibility, "stdout_visibility": stdout_visibility}
    files = bundle_files(root, config, torch_version)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for rel, data in sorted(files.items()):
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data if isinstance(data, bytes) else data.encode())
            info = zipfile.ZipInfo(rel, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            mode = 0o755 if rel in EXECUTABLE else 0o644
            info.external_attr = (0o100000 | mode) << 16
            if rel in EXECUTABLE:
                path.chmod(mode)
            z.writestr(info, path.read_bytes())
    return out, archive
