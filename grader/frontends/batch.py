"""`python -m grader batch SUBMISSIONS`: grade a class.

SUBMISSIONS is a folder; each notebook (*.ipynb) or sub-folder laid out like puzzles/ in it is one submission.
Each submission runs in its own child process, with a time limit and a memory limit. The child only *observes*:
it runs the learner's functions on the simulator and writes what they computed and what the ledger and clock
recorded (tensors and plain data, read back with `torch.load(weights_only=True)`, which cannot run code). The
parent, which never imports the learner's code, computes the references and decides every verdict. A
submission that crashes, hangs, exhausts memory or prints garbage gets an error row; the others are graded as usual.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

import torch

from ..backends.simulator import observe_file
from ..core.grading import grade_observation
from ..core.result import ERROR, FAIL, NOT_ATTEMPTED, PASS, PuzzleResult
from ..core.spec import Observation
from ..specs import select
from .notebook_file import notebook_target


def submissions_in(folder: Path) -> list[Path]:
    items = [p for p in sorted(folder.iterdir()) if p.suffix == ".ipynb" or (p.is_dir() and not p.name.startswith("."))]
    if not items:
        raise FileNotFoundError(f"no submissions in {folder} (expected notebooks or folders laid out like puzzles/)")
    return items


# ---- the child: runs the learner's code, returns observations


def observe_submission(submission: Path, seed: int, out: Path, puzzle_ids=None) -> None:
    """Child side: observe every puzzle of one submission and save {id: record} to `out`."""
    def observe_all(folder: Path) -> dict:
        records = {}
        for spec in select(puzzle_ids):
            observed = observe_file(spec, folder / spec.filename, spec.make_inputs(seed), seed)
            if isinstance(observed, PuzzleResult):  # not attempted, or an error: nothing to grade
                records[spec.id] = {"status": observed.status, "error": observed.error}
            else:
                records[spec.id] = {"status": "observed", "observation": asdict(observed)}
        return records

    if submission.suffix == ".ipynb":
        with notebook_target(submission) as folder:
            records = observe_all(folder)
    else:
        records = observe_all(submission)
    torch.save(records, out)


def _limit_memory(megabytes: int):
    def apply():
        os.setsid()  # its own process group, so a timeout kills everything it started
        limit = megabytes * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


# ---- the parent: decides


def grade_submission(submission: Path, seed: int, timeout: float, memory_mb: int, puzzle_ids=None) -> dict:
    started = time.monotonic()
    row = {"name": submission.name, "error": "", "puzzles": []}
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        out = Path(tmp) / "observations.pt"
        cmd = [sys.executable, "-m", "grader", "_observe", str(submission), "--seed", str(seed), "--out", str(out)]
        cmd += [f"--puzzle={p}" for p in puzzle_ids or ()]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                preexec_fn=_limit_memory(memory_mb), cwd=os.getcwd())
        try:
            _, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            row["error"] = f"timed out after {timeout:g} s (a hang, or an endless loop outside the simulator)"
            return _finish(row, started)
        stderr = stderr.decode(errors="replace")
        if proc.returncode != 0 or not out.exists():
            row["error"] = _crash_reason(proc.returncode, stderr, memory_mb)
            return _finish(row, started)
        try:
            records = torch.load(out, weights_only=True)
        except Exception as exc:  # something that is not tensors and plain data
            row["error"] = f"the submission produced data the grader will not load ({type(exc).__name__})"
            return _finish(row, started)
    row["puzzles"] = [verdict(spec, records.get(spec.id), seed) for spec in select(puzzle_ids)]
    return _finish(row, started)


def verdict(spec, record, seed: int) -> PuzzleResult:
    if not isinstance(record, dict) or "status" not in record:
        return PuzzleResult(spec.id, spec.name, spec.title, ERROR, error="no record for this puzzle")
    if record["status"] != "observed":
        return PuzzleResult(spec.id, spec.name, spec.title, record["status"], error=str(record.get("error", "")))
    try:
        obs = Observation(**record["observation"])
        return grade_observation(spec, obs, spec.make_inputs(seed))
    except Exception as exc:  # the learner's functions returned something the checks cannot read
        return PuzzleResult(spec.id, spec.name, spec.title, ERROR,
                            error=f"the answer returned data the grader cannot check: {type(exc).__name__}: {exc}")


def _crash_reason(returncode: int, stderr: str, memory_mb: int) -> str:
    tail = stderr.strip().splitlines()[-3:]
    if any(m in stderr for m in ("MemoryError", "can't allocate memory", "Cannot allocate memory")):
        return f"ran out of memory (limit {memory_mb} MiB): " + " | ".join(tail)
    if returncode < 0:
        return f"crashed (signal {-returncode}): " + " | ".join(tail)
    return f"crashed (exit status {returncode}): " + " | ".join(tail)


def _finish(row: dict, started: float) -> dict:
    row["seconds"] = round(time.monotonic() - started, 2)
    return row


def run_batch(folder: Path, seed: int, timeout: float, memory_mb: int, puzzle_ids=None, jobs: int = 1,
              progress=sys.stderr) -> list[dict]:
    """Grade every submission, `jobs` child processes at a time; rows come back in the folder's order."""
    items = submissions_in(folder)
    rows: dict[Path, dict] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # threads only wait on the children
        futures = {pool.submit(grade_submission, s, seed, timeout, memory_mb, puzzle_ids): s for s in items}
        for done, future in enumerate(as_completed(futures), 1):
            submission = futures[future]
            row = rows[submission] = future.result()
            print(f"[{done}/{len(items)}] {submission.name}: {summary(row)} ({row['seconds']:.1f} s)",
                  file=progress, flush=True)
    return [rows[s] for s in items]


def summary(row: dict) -> str:
    if row["error"]:
        return f"ERROR: {row['error']}"
    counts = {s: sum(p.status == s for p in row["puzzles"]) for s in (PASS, FAIL, ERROR, NOT_ATTEMPTED)}
    return (f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[ERROR]} errors, "
            f"{counts[NOT_ATTEMPTED]} not attempted")
