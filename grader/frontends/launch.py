"""Grade puzzles on a real cluster: one process per rank, started by torchrun.

    torchrun --nproc-per-node 4 -m grader.launch p3 --target solutions
    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-endpoint HOST:29500 -m grader.launch p3 p8 --target my_answers

Every process runs the same per-rank program as `python -m grader check --backend torch` (grader/backends/real/):
the spec's `program` with `dist` = torch.distributed, under the same memory ledger and communication tracker.
NCCL when the machine has GPUs (each rank on its own device, LOCAL_RANK; factory functions create tensors there),
gloo otherwise. Rank 0 gathers what every rank returned, grades it against the serial reference and prints the
report; every rank exits with the grade's status (0: all passed, 1: something failed, 2: a usage error).

Differences from `check --backend torch`: the processes are torchrun's, so this module cannot kill and restart
them. Each puzzle runs in a fresh process group (on torchrun's store), so one that hangs ends when the backend's
time limit (--timeout) fires on the waiting ranks, and the next puzzle starts clean. A rank that dies, or NCCL's
watchdog stopping a process on a timeout, ends the whole job (torchrun then reports the failure).
"""

from __future__ import annotations

import argparse
import datetime
import os
import secrets
import sys
import tempfile
import types
from pathlib import Path

import torch
import torch.distributed as dist

from ..backends import real
from ..backends.learner_code import not_implemented_result
from ..backends.real.reports import raised_not_implemented
from ..backends.tamper import describe
from ..core import report
from ..core.grading import grade_observation
from ..core.result import ERROR, NOT_ATTEMPTED, PASS, TAMPERED, PuzzleResult
from ..specs import SPECS
from .targets import resolve_target


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m grader.launch",
                                description="Grade puzzles on real torch.distributed processes started by torchrun.")
    p.add_argument("puzzles", nargs="+", help="puzzle ids (p3 ...): each must be written for the world size")
    p.add_argument("--target", default="puzzles", help="'puzzles', 'solutions', a folder like puzzles/, or a notebook")
    p.add_argument("--seed", type=int, help="the grading seed (default: a fresh one, drawn by rank 0)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="auto: nccl when this machine has a GPU per local rank, else gloo")
    p.add_argument("--timeout", type=float, default=real.DEFAULT_TIMEOUT,
                   help="seconds a collective or message may wait before the backend gives up (default 60)")
    p.add_argument("--json", action="store_true", help="rank 0 prints one JSON object instead of the table")
    p.add_argument("--verbose", "-v", action="store_true", help="show passing checks too")
    return p


def pick_backend(choice: str, local_world_size: int) -> str:
    if choice != "auto":
        return choice
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        return "nccl"
    return "gloo"


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print("grader.launch runs under torchrun: torchrun --nproc-per-node N -m grader.launch "
              f"{' '.join(args.puzzles)} --target {args.target}\n(on one machine without torchrun: "
              f"python -m grader check {args.target} --backend torch)", file=sys.stderr)
        return 2
    unknown = [p for p in args.puzzles if p not in SPECS]
    if unknown:
        print(f"error: unknown puzzle(s) {unknown}; known: {list(SPECS)}", file=sys.stderr)
        return 2
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = pick_backend(args.backend, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    real.enable_debug_detail()
    device = real.device_for(backend, local_rank)
    timeout = datetime.timedelta(seconds=args.timeout)
    options = {"device_id": device} if device is not None else {}
    dist.init_process_group(backend, timeout=timeout, **options)  # the rendezvous, through torchrun's store
    store = dist.distributed_c10d._get_default_store()
    count = [0]

    def fresh_group():
        """A new default process group, and the gloo group the ranks report through. Each puzzle gets its own:
        a message a wrong answer left unmatched cannot reach the next puzzle, and DETAIL's fingerprints (whose
        sequence numbers point-to-point ops advance too) start from zero."""
        if count[0]:
            dist.destroy_process_group()
            dist.init_process_group(backend, store=dist.PrefixStore(f"grader.launch/{count[0]}/", store), rank=rank,
                                    world_size=world, timeout=timeout, **options)
        count[0] += 1
        # What the ranks tell each other (CPU objects). Its time limit outlasts the puzzle's: a rank that returned
        # early waits here while another waits out the puzzle's time limit in a deadlock.
        return dist.new_group(backend="gloo", timeout=2 * timeout + datetime.timedelta(seconds=60))

    try:
        return grade(args, rank, world, backend, device, fresh_group)
    finally:
        dist.destroy_process_group()


def grade(args, rank: int, world: int, backend: str, device, fresh_group) -> int:
    meta = fresh_group()
    seed = [args.seed if args.seed is not None else secrets.randbelow(1_000_000)]
    dist.broadcast_object_list(seed, src=0, group=meta)
    seed = seed[0]
    try:
        target = resolve_target(args.target)
    except FileNotFoundError as exc:
        if rank == 0:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="grader-launch-") as tmp:
        folder = target
        if target.suffix == ".ipynb":
            from .notebooks.file import extract_to_folder

            folder = extract_to_folder(target, Path(tmp))
        results, figures = [], []
        for k, puzzle in enumerate(args.puzzles):
            spec = SPECS[puzzle]
            if spec.job_of_launches:
                results.append(PuzzleResult(
                    spec.id, spec.name, spec.title, ERROR,
                    error=f"{spec.id} is graded on a job that dies and is started again, on {spec.world_size} ranks "
                          f"and then on fewer: one torchrun launch cannot do that. Grade it with `python -m grader "
                          f"check TARGET -p {spec.id} --backend torch`, which starts and ends the processes itself"))
                continue
            if spec.world_size != world:
                results.append(PuzzleResult(
                    spec.id, spec.name, spec.title, ERROR,
                    error=f"{spec.id} is written for {spec.world_size} rank(s) (its shards, inputs and budgets are "
                          f"sized for that); this job has {world}: start it with --nproc-per-node "
                          f"{spec.world_size} (times the nodes)"))
                continue
            if k:
                meta = fresh_group()
            task = real.PuzzleTask(spec.id, str(folder / spec.filename), seed)
            if device is not None and device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            payload = real.execute(task, rank, world, device)
            if device is not None and device.type == "cuda" and "error" not in payload:
                payload["device_peak_bytes"] = torch.cuda.max_memory_allocated(device)
            gathered = [None] * world if rank == 0 else None
            dist.gather_object(payload, gathered, dst=0, group=meta)
            if rank == 0:
                result, figure = judge(spec, task, gathered, seed, backend, args.timeout)
                results.append(result)
                figures.append(figure)
    code = [0]
    if rank == 0:
        if args.json:
            print(report.to_json(results, str(args.target), seed))
        else:
            on = f"torch.distributed ({backend}, {world} processes started by torchrun)"
            print(report.console(results, str(args.target), seed, verbose=args.verbose, backend=on))
            for line in figures:
                if line:
                    print(line)
        code = [1 if any(r.status not in (PASS, NOT_ATTEMPTED) for r in results) else 0]
    dist.broadcast_object_list(code, src=0, group=meta)
    return code[0]


def judge(spec, task, payloads, seed: int, backend: str, timeout: float) -> tuple[PuzzleResult, str]:
    """Rank 0: grade the gathered payloads, as `check --backend torch` does; plus a line of real figures."""
    tampered = sorted({t for p in payloads if p for t in p.get("tampering", ())})
    if tampered:
        return PuzzleResult(spec.id, spec.name, spec.title, TAMPERED, error=describe(tampered)), ""
    status = real.classify(payloads)
    if status == "not_attempted":  # every rank stopped at a NotImplementedError: how far along is the puzzle?
        first = next(p["error"] for p in payloads if "error" in p)
        learner_file = types.SimpleNamespace(__file__=task.path)  # its source is all it needs: no import here
        return not_implemented_result(spec, learner_file, raised_not_implemented(first)), ""
    if status == "error":
        return PuzzleResult(spec.id, spec.name, spec.title, ERROR,
                            error=real.describe_errors(task.describe(), payloads, backend, timeout)), ""
    result = grade_observation(spec, real.observation(payloads), spec.make_inputs(seed))
    figure = ""
    if all("device_peak_bytes" in p for p in payloads):
        figure = (f"{spec.id}: peak memory per rank, ledger {[p['ledger']['peak'] for p in payloads]} bytes; CUDA "
                  f"caching allocator {[p['device_peak_bytes'] for p in payloads]} bytes (the allocator rounds "
                  f"every block up to 512 bytes and also holds what the ledger leaves out: the private copies "
                  f"the tracker hands to NCCL, library workspaces)")
    return result, figure


if __name__ == "__main__":
    sys.exit(main())
