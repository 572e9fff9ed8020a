"""`python -m grader batch SUBMISSIONS`: grade a class, each puzzle of each submission in a jail of its own.

SUBMISSIONS is a folder; each notebook (*.ipynb) or sub-folder laid out like puzzles/ in it is one submission, and
anything else in it gets a row that says so. The parent copies each submission (its top-level .py files; a
notebook's puzzle cells, which a zygote's child reads within a time limit) into a private folder, then asks a
zygote (zygote.py: torch imported once per job) to run each puzzle in a fresh jail (sandbox.py) with its own time
and memory limits. The parent is a subreaper: what a puzzle leaves running past its warden and its zygote is
orphaned onto it, and killed (Strays). The jail only observes; the
parent, which never imports a learner's code, parses the record (record.py: no pickle), checks its
structure, computes the reference and decides the verdict. A puzzle that loops, crashes, exits, exhausts memory
or tampers with the grader costs that puzzle only, with a reason the learner can read. The threat model is in
docs/grading.md ("Grading for credit").
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from ...core.result import ERROR, FAIL, NOT_ATTEMPTED, PASS, PuzzleResult
from ...specs import select
from ..progress import Progress
from . import reaper, sandbox, wire
from .submissions import Broken, Submission, private_copy, submissions_in
from .verdict import printable, verdict

GRACE = 30.0  # seconds past a puzzle's limit for its warden to answer before the worker counts as lost
READ_SECONDS = 60  # to read a notebook's cells (measured: 0.3 s for the standalone notebook, which is the largest)
ENVIRONMENT = {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH"}  # what a worker inherits


# ---- the workers


class Strays:
    """The batch's parent is a subreaper (Linux): whatever a puzzle starts that outlives its warden and its zygote
    (a daemon that killed both) is orphaned onto it, not onto init. `sweep` kills and reaps every such child, never
    a worker's zygote nor a child this process had before the batch; `close` sweeps and stops being a subreaper."""

    def __init__(self):
        self.lock = threading.Lock()  # a sweep never runs while a worker's zygote is being started
        self.keep = set(reaper.children_of(os.getpid()))
        self.was_subreaper = sandbox.subreaper(True)

    def spawn(self, start):
        with self.lock:
            proc = start()
            self.keep.add(proc.pid)
            return proc

    def forget(self, pid: int) -> None:
        with self.lock:
            self.keep.discard(pid)

    def sweep(self) -> None:
        with self.lock:
            reaper.kill_strays(self.keep)

    def close(self) -> None:
        self.sweep()
        if not self.was_subreaper:
            sandbox.subreaper(False)


class Worker:
    """One job slot: a zygote process and the socket to it. Restarted if it stops answering (and what its puzzles
    left orphaned onto the batch's parent is killed then: `strays`)."""

    def __init__(self, slot: int, mode: str, logs: Path, strays: Strays):
        self.slot, self.mode, self.logs, self.closing, self.strays = slot, mode, logs, False, strays
        self.start()

    def start(self) -> None:
        ours, theirs = socket.socketpair()
        env = {k: v for k, v in os.environ.items() if k in ENVIRONMENT}  # none of your secrets reach a puzzle
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1",
                   PYTHONUNBUFFERED="1",  # what a puzzle printed before os._exit() or a crash reaches its error
                   TMPDIR=str(self.logs))  # the zygote's folders go where the batch's cleanup finds them
        root = str(Path(__file__).resolve().parents[2])  # the zygote imports this very grader
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
        self.log = open(self.logs / f"zygote-{self.slot}.log", "ab")
        self.proc = self.strays.spawn(lambda: subprocess.Popen(
            [sys.executable, "-m", "grader", "_zygote", "--fd", str(theirs.fileno()), "--sandbox", self.mode,
             "--slot", str(self.slot)], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=self.log,
            stderr=self.log, env=env, start_new_session=True))
        theirs.close()
        self.sock, self.ready = ours, None

    def wait_ready(self) -> dict:
        if self.ready is None:
            try:
                ready, _ = wire.receive(self.sock, time.monotonic() + 300)
            except (EOFError, TimeoutError, OSError) as exc:
                self.stop()
                raise RuntimeError(f"the grading worker did not start ({exc}): {self.log_tail()}") from None
            if not ready.get("ready"):
                self.stop()
                raise RuntimeError(f"no sandbox can be built here: {ready.get('error')}")
            self.ready = ready
        return self.ready

    def run(self, request: dict) -> tuple[dict, bytes]:
        self.wait_ready()
        try:
            wire.send(self.sock, request)
            return wire.receive(self.sock, time.monotonic() + request["timeout"] + GRACE)
        except (EOFError, TimeoutError, OSError) as exc:  # a grader failure, not the learner's
            if self.closing:
                return {"puzzle": request["puzzle"], "warden_error": "the batch was interrupted"}, b""
            tail = self.log_tail()
            self.replace()
            return {"puzzle": request["puzzle"], "warden_error": f"{exc}; {tail}"}, b""

    def read_notebook(self, notebook: Path, into: Path) -> str:
        """The zygote reads the notebook in a child of its own, within READ_SECONDS (zygote.read_notebook); '' or
        why it could not."""
        self.wait_ready()
        try:
            wire.send(self.sock, {"notebook": str(notebook), "into": str(into), "timeout": READ_SECONDS})
            reply, _ = wire.receive(self.sock, time.monotonic() + READ_SECONDS + GRACE)
        except (EOFError, TimeoutError, OSError) as exc:  # a grader failure: the worker is replaced
            if self.closing:
                return "the batch was interrupted"
            tail = self.log_tail()
            self.replace()
            return f"the grader could not read the notebook ({exc}; {tail})"
        return printable(str(reply.get("error", "")), 300)

    def replace(self) -> None:
        """A worker that stopped answering: stop it, and everything it left behind, and start afresh."""
        self.stop()
        self.strays.sweep()
        self.start()

    def log_tail(self) -> str:
        try:
            return printable((self.logs / f"zygote-{self.slot}.log").read_text(errors="replace")[-600:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM: the zygote passes it to the warden at work, which kills its puzzle and all it started, and
        leaves; then make sure of it (SIGKILL to the zygote's group, then the slot's uid)."""
        self.sock.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.strays.forget(self.proc.pid)
        uid = (self.ready or {}).get("uid")
        if uid is not None:
            reaper.sweep_uid(uid)
        self.log.close()


# ---- the parent


def grade_submission(sub: Submission, index: int, worker: Worker | None, seed: int, timeout: float,
                     memory_mb: int, puzzle_ids, scratch: Path, submission_timeout: float | None = None) -> dict:
    """One row. Each puzzle gets `timeout` seconds, or what is left of `submission_timeout` when that is less."""
    started = time.monotonic()
    deadline = started + submission_timeout if submission_timeout else None
    row = {"name": sub.name, "kind": sub.kind, "error": sub.error, "puzzles": [], "seconds": 0.0,
           "flags": list(sub.flags), "graded": sub.graded, "note": sub.note, "items": list(sub.items)}
    if sub.error:
        return _finish(row, started)
    copy = scratch / f"{index:05d}"
    try:
        row["flags"] += private_copy(sub, into=copy, worker=worker)
        for spec in select(puzzle_ids):
            limit = timeout if deadline is None else min(timeout, deadline - time.monotonic())
            if limit <= 0.5:  # not enough left to start a puzzle's process
                row["puzzles"].append(out_of_time(spec, submission_timeout))
                continue
            request = {"puzzle": spec.id, "copy": str(copy), "seed": seed, "timeout": limit, "memory_mb": memory_mb}
            reply, payload = worker.run(request)
            result, flags = verdict(spec, reply, payload, seed, limit, memory_mb)
            if result.status == NOT_ATTEMPTED and result.error.startswith("there is no "):  # not the jail's path
                where = f" ({sub.graded})" if sub.graded.endswith("/") else ""  # the folder it was looked for in
                result.error = f"not handed in: there is no {spec.filename} in this submission{where}"
            if limit < timeout and reply.get("timed_out"):  # the submission's limit stopped it, not its own
                _, _, said = result.error.partition("\n")
                result.error = (f"stopped after {limit:.1f} s, what was left of the submission's time limit of "
                                f"{submission_timeout:g} s: an endless loop, or a wait that never ends? (the puzzles "
                                f"before it took the rest)" + ("\n" + said if said else ""))
            row["puzzles"].append(result)
            row["flags"] += flags
    except Broken as exc:
        row["kind"], row["error"] = "broken", str(exc)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    return _finish(row, started)


def out_of_time(spec, submission_timeout: float) -> PuzzleResult:
    return PuzzleResult(spec.id, spec.name, spec.title, ERROR, error=(
        f"not graded: the submission's time limit of {submission_timeout:g} s ran out before this puzzle (the "
        f"puzzles before it took that long: see their own errors)"))


def _finish(row: dict, started: float) -> dict:
    row["seconds"] = round(time.monotonic() - started, 2)
    return row


def run_batch(folder: Path, seed: int, timeout: float, memory_mb: int, puzzle_ids=None, jobs: int = 1,
              progress=sys.stderr, sandbox_mode: str = "auto", submission_timeout: float | None = None) -> list[dict]:
    """Grade every item of `folder`, `jobs` at a time; one row per item, in the folder's order. `timeout` is the
    limit of each puzzle, in seconds, so a submission takes at most (number of puzzles) x timeout, or
    `submission_timeout` when that is given and less. `progress` is the stream of the log (the sandbox, then a line
    per submission as it is graded); at a terminal a progress line with the time left stays under it."""
    if not hasattr(os, "fork"):
        raise OSError("batch grading needs fork() (Linux or macOS); on Windows, run it in WSL2 or a Linux container")
    items = submissions_in(Path(folder))
    gradable = [i for i in items if not i.error]
    rows: dict[int, dict] = {}
    strays = Strays()  # from here on, what a puzzle leaves behind is orphaned onto this process, and killed
    workers: list[Worker] = []
    with tempfile.TemporaryDirectory(prefix="grader-batch-") as tmp:
        scratch = Path(tmp)
        scratch.chmod(0o711)  # a job's uid may pass through (process mode); nobody may list it
        pool = bar = None
        try:
            for slot in range(min(max(1, jobs), len(gradable), sandbox.JOBS_PER_BATCH)):
                workers.append(Worker(slot, sandbox_mode, scratch, strays))
            if workers:
                print(describe_sandbox(workers[0].wait_ready()), file=progress, flush=True)
            idle: queue.Queue = queue.Queue()
            for w in workers:
                idle.put(w)

            def grade(index: int, item: Submission) -> dict:
                if item.error:  # a row that says why, with no worker
                    return grade_submission(item, index, None, seed, timeout, memory_mb, puzzle_ids, scratch)
                worker = idle.get()
                try:
                    return grade_submission(item, index, worker, seed, timeout, memory_mb, puzzle_ids, scratch,
                                            submission_timeout)
                finally:
                    idle.put(worker)

            pool = ThreadPoolExecutor(max_workers=max(1, len(workers)))
            futures = {pool.submit(grade, i, item): i for i, item in enumerate(items)}
            bar = Progress(len(items), "submissions graded", progress)  # drawn at a terminal only
            for done, future in enumerate(as_completed(futures), 1):
                row = rows[futures[future]] = future.result()
                bar.write(f"[{done}/{len(items)}] {printable(row['name'])}: {summary(row)} ({row['seconds']:.1f} s)",
                          advance=1)
        finally:  # also on Ctrl-C: stop the workers first, so that no thread waits out a puzzle's limit
            if bar is not None:
                bar.close()
            for w in workers:
                w.closing = True
                w.stop()
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            strays.close()
    return [rows[i] for i in range(len(items))]


def describe_sandbox(ready: dict) -> str:
    lines = [f"sandbox: {ready['mode']} ({sandbox.GUARANTEES[ready['mode']]})"]
    lines += [f"  note: {n}" for n in ready.get("notes", [])]
    return "\n".join(lines)


def summary(row: dict) -> str:
    if row["error"]:
        return f"{row['kind'].upper()}: {printable(row['error'])}"
    counts = {s: sum(p.status == s for p in row["puzzles"]) for s in (PASS, FAIL, ERROR, NOT_ATTEMPTED)}
    flagged = f"; {len(row['flags'])} flags" if row.get("flags") else ""
    return (f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[ERROR]} errors, "
            f"{counts[NOT_ATTEMPTED]} not attempted{flagged}")
