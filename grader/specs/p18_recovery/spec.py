"""p18 recovery: a sharded checkpoint, a failure, an exact resume, resharding from 4 ranks to 2.

Graded on a job of launches that share one disk (job.py), against the grader's own run of the same job
without a checkpoint (the control, `reference`). Five checks, each measured as such:

    exact resume        saving changes nothing (the train launch's state after each save and at the end is the
                        control's), and after rank 2 dies at step 5, four fresh ranks load the newest checkpoint,
                        every piece of the state bit for bit the control's after step 4, and end as it ends
    crash points        a launch dies at every change a rank makes to the disk while it saves step 4; each time a
                        fresh launch loads the last good checkpoint (step 2 or 4, whole) and ends as the control
    damaged checkpoint  one byte of rank 2's shard of step 4 flipped after the fact: the load falls back to step 2
    bytes written       per rank and save, at most its shard plus the replicated state and the manifest
    reshard 4 to 2      two fresh ranks load step 4 with the shards joined and cut in two, and end as the control
                        on two ranks from there

A piece that differs is named with what it holds; a likely cause only where the evidence singles one out (the
piece still holds the value a fresh process starts with, the loaded step is another checkpoint's, the ranks
loaded different checkpoints).
"""

from __future__ import annotations

import functools

import torch

from puzzles import sim
from puzzles.sim import CostModel, Disk

from ...core.result import Budget, Check, fmt
from ...core.spec import Observation, PuzzleSpec
from . import job as jobs
from . import training
from .training import N, PIECES, PSI, SAMPLES, SAVES, STEPS, differences, piece_mismatch

COST = CostModel(latency_ticks=8, bytes_per_tick=512)
SHARD_BYTES = 3 * 4 * PSI // N  # master, m and v in float32: 12·Ψ/N
GENERATOR_BYTES = 5_056  # torch.Generator().get_state() on a CPU: a uint8 tensor of 5,056 bytes
REPLICATED_BYTES = GENERATOR_BYTES + 8 * SAMPLES  # the generator's state and the order (the scalars aside)
FRAMING_BYTES = 4 * 1024  # a file's torch.save framing (about 2 KB) and room for the manifest's numbers


class Recovery(PuzzleSpec):
    id, name, title = "p18", "recovery", "Recovery (sharded checkpoint, failure, resume)"
    entries = ("save_checkpoint", "load_checkpoint")
    world_size = N
    cost = COST
    job_of_launches = True
    modules = ("io", "zlib", "json", "hashlib", "struct")  # a checkpoint's bytes: torch.save to a buffer, its checksum
    hints = ("Write each rank's shard under a temporary name and rename it; gather the checksums; one rank writes "
             "the manifest last, under a temporary name, and renames it: that rename is the commit. Load the newest "
             "folder whose manifest exists and whose shards match it, all ranks agreeing (all_reduce).",)

    def make_inputs(self, seed):
        x, target, start = training.make_data(seed)
        return {"seed": seed, "x": x, "target": target, "start": start}

    def launch(self, inputs):
        return (inputs["seed"], inputs["x"], inputs["target"], inputs["start"]), None

    def program(self, module):
        if module is None:  # the grader's control runs
            return jobs.program()
        return jobs.program(module.save_checkpoint, module.load_checkpoint)

    def job(self, launcher, inputs):
        record = jobs.job(launcher, self.reference(inputs))
        results = [dict(r) for r in record.train]
        results[0]["job"] = record.to_dict()
        return launcher.observation(results)

    def reference(self, inputs):
        """The control: the job's training without a checkpoint, on 4 ranks, then on 2 from step 4 (computed once
        per seed: the job itself compares the crash points with it as they run)."""
        return control(inputs["seed"])

    def budgets(self, inputs):
        return {
            "bytes written": Budget(
                "bytes written", f"12·Ψ/N + G + 2·F = {SHARD_BYTES:,} + {REPLICATED_BYTES:,} + {2 * FRAMING_BYTES:,}"
                f" bytes for the one rank that writes the manifest (its shard of master, m and v in float32; the "
                f"replicated state, the generator's {GENERATOR_BYTES:,} bytes and the order's {8 * SAMPLES}; "
                f"F = {FRAMING_BYTES:,} bytes of torch.save's framing for each of its two files)",
                SHARD_BYTES + REPLICATED_BYTES + 2 * FRAMING_BYTES, "bytes"),
            "bytes written by the others": Budget(
                "bytes written by the others", f"12·Ψ/N + F = {SHARD_BYTES:,} + {FRAMING_BYTES:,} bytes for every "
                f"other rank (its shard alone)", SHARD_BYTES + FRAMING_BYTES, "bytes"),
        }

    # ---- the checks

    def check(self, obs: Observation, ref, inputs):
        job = (obs.results[0] or {}).get("job") or {}
        return [self.check_resume(obs.results, job.get("resume") or {}, ref),
                self.check_points(job.get("points") or [], ref, obs.results),
                self.check_damaged(job.get("damaged") or {}, job.get("damaged_file", ""), ref,
                                   job.get("damaged_listing"), obs.results),
                self.check_bytes(obs.results, self.budgets(inputs)),
                self.check_reshard(job.get("reshard") or {}, ref)]

    def check_resume(self, train, resume, ref) -> Check:
        name = "exact resume"
        off = differences([(r or {}).get("loaded") for r in train], ref["at"][0])
        if off:
            return Check(name, False, f"the first launch called load_checkpoint on an empty disk, and it changed the "
                         f"state: {off[0]}", diagnosis="with no checkpoint on the disk (the first launch of a job), "
                         "load_checkpoint leaves the state as a fresh process has it")
        stopped = next(((r or {}).get("stopped") for r in train if (r or {}).get("stopped")), "")
        if stopped:
            return Check(name, False, f"the first launch called load_checkpoint on an empty disk, and then "
                         f"{stopped}", diagnosis="with no checkpoint on the disk (the first launch of a job), "
                         "load_checkpoint leaves the state as a fresh process has it")
        for s in SAVES:
            off = differences([(r or {}).get("at", {}).get(s) for r in train], ref["at"][s])
            if off:
                return Check(name, False, f"saving changed the training: right after save_checkpoint of step {s}, "
                             f"{off[0]}", diagnosis="save_checkpoint must leave the state as it found it: write "
                             "copies, draw nothing from state.generator, assign nothing")
        off = differences([(r or {}).get("final") for r in train], ref["final"])
        if off:
            return Check(name, False, f"saving changed the training: at the end of the run that saved after steps "
                         f"{_steps(SAVES)}, {off[0]}")
        loaded = _loaded(resume, "the resume after rank 2 died at step 5")
        if isinstance(loaded, Check):
            return Check(name, False, loaded.message, diagnosis=loaded.diagnosis)
        expected = ref["at"][SAVES[-1]]
        off = differences(loaded, expected)
        if off:
            return Check(name, False, f"after rank {jobs.CRASH_RANK} died at the start of step {jobs.CRASH_STEP}, 4 "
                         f"fresh ranks called load_checkpoint: {off[0]}" + _also(off),
                         diagnosis=diagnose_load(loaded, expected, SAVES[-1], ref["fresh_generator"]))
        off = differences([r.get("final") for r in resume["results"]], ref["final"])
        if off:
            return Check(name, False, f"the resumed run loaded step {SAVES[-1]} exactly, but at the end of step "
                         f"{STEPS}: {off[0]}")
        return Check(name, True, f"saving after steps {_steps(SAVES)} changed nothing; after rank {jobs.CRASH_RANK} "
                     f"died at the start of step {jobs.CRASH_STEP}, 4 fresh ranks loaded step {SAVES[-1]}, the newest "
                     f"checkpoint, and ran to step {STEPS}: every piece of the state ({', '.join(PIECES)}) equal bit "
                     f"for bit to the run without a failure, on every rank, right after loading and at the end")

    def check_points(self, points, ref, train=()) -> Check:
        name = "crash points"
        if not points:
            return Check(name, False, f"save_checkpoint of step {jobs.POINTS_SAVE} made no change to the disk: "
                         f"nothing was saved")
        counts = {}
        for p in points:
            event = p["event"]
            where = _describe_event(event)
            if not p["died"]:
                return Check(name, False, f"a launch was to die {where}, but never got there: save_checkpoint made "
                             f"other changes to the disk than in the first run (it must do the same every time)")
            loaded = _loaded(p["resume"], f"the resume after a crash {where}")
            if isinstance(loaded, Check):
                return Check(name, False, loaded.message + f". The disk after the crash: {_listing(p['listing'])}"
                             f"{_left(p)}", diagnosis=loaded.diagnosis or diagnose_point_error(p, train))
            step = _common_step(loaded)
            if step not in SAVES:
                return Check(name, False, f"after a crash {where}, load_checkpoint restored step {step}, not a "
                             f"checkpoint (step {_steps(SAVES, ' or ')}). The disk after the crash: "
                             f"{_listing(p['listing'])}", diagnosis=diagnose_point(loaded, p, ref))
            off = differences(loaded, ref["at"][step])
            if not off:
                off = differences([r.get("final") for r in p["resume"]["results"]], ref["at"][step + 1])
            if off:
                return Check(name, False, f"after a crash {where}, load_checkpoint restored step {step}, but {off[0]}. "
                             f"The disk after the crash: {_listing(p['listing'])}{_left(p)}",
                             diagnosis=diagnose_load(loaded, ref["at"][step], step, ref["fresh_generator"]))
            counts[step] = counts.get(step, 0) + 1
        per_rank = {}
        for p in points:
            per_rank[p["event"]["rank"]] = per_rank.get(p["event"]["rank"], 0) + 1
        ranks = ", ".join(f"rank {r}: {n}" for r, n in sorted(per_rank.items()))
        loads = ", ".join(f"step {s} after {n}" for s, n in sorted(counts.items()))
        return Check(name, True, f"{len(points)} crash points, every change a rank made to the disk while it saved "
                     f"step {jobs.POINTS_SAVE} ({ranks}; a file dies half written, a rename or a removal before it "
                     f"happens): after each, a fresh launch loaded a whole checkpoint ({loads}) bit for bit, and its "
                     f"next step was the run's without a failure", measured=len(points))

    def check_damaged(self, damaged, path, ref, listing=None, train=()) -> Check:
        name = "damaged checkpoint"
        where = (f"one byte in the middle of {path} (rank {jobs.DAMAGED_RANK}'s shard of step {jobs.POINTS_SAVE}) "
                 f"flipped")
        loaded = _loaded(damaged, f"the resume with {where}")
        if isinstance(loaded, Check):
            return Check(name, False, loaded.message, diagnosis=loaded.diagnosis)
        step = _common_step(loaded)
        expected_step = SAVES[-2]
        if step != expected_step:
            diagnosis = ""
            if step == jobs.POINTS_SAVE:
                diagnosis = ("a damaged shard was loaded: record each shard's checksum (zlib.crc32 of its bytes) in "
                             "the manifest, and check it before loading; if any shard of a checkpoint fails, every "
                             "rank falls back to the one before")
            elif step == 0:
                kept = {n for n, _, _ in jobs.final_files(jobs.save_events(list(train), expected_step))}
                gone = sorted(kept - set(listing or {}))
                if gone:
                    diagnosis = (f"step {expected_step}'s checkpoint was deleted ({', '.join(gone[:2])}"
                                 f"{' ...' if len(gone) > 2 else ''} are gone from the disk), so nothing was left to "
                                 f"fall back to: keep the checkpoint before the newest")
                else:
                    diagnosis = (f"nothing was loaded although step {expected_step}'s checkpoint was on the disk, "
                                 f"whole: fall back to it when the newest does not check out")
            return Check(name, False, f"with {where}, load_checkpoint restored {_step_text(loaded)}; expected step "
                         f"{expected_step}, the newest checkpoint that is whole", diagnosis=diagnosis)
        off = differences(loaded, ref["at"][step]) or differences(
            [r.get("final") for r in damaged["results"]], ref["final"])
        if off:
            return Check(name, False, f"with {where}, load_checkpoint fell back to step {step}, but {off[0]}",
                         diagnosis=diagnose_load(loaded, ref["at"][step], step, ref["fresh_generator"]))
        return Check(name, True, f"with {where}, load_checkpoint fell back to step {step} on every rank, and the run "
                     f"went on exactly")

    def check_bytes(self, train, budgets: dict) -> Check:
        """Per save: the rank that wrote the most within the manifest's budget, every other rank within its shard's,
        and every rank wrote something (its shard)."""
        name, one, others = "bytes written", budgets["bytes written"], budgets["bytes written by the others"]
        rows, problem, worst = [], None, (0, 0, 0)
        for s in SAVES:
            per_rank = [sum(e["nbytes"] for e in (res or {}).get("disk") or []
                            if e["phase"] == f"save {s}" and e["op"] == "write") for res in train]
            rows.append(f"save {s}: {', '.join(f'{b:,}' for b in per_rank)}")
            top = max(range(len(per_rank)), key=per_rank.__getitem__)
            worst = max(worst, (per_rank[top], s, top))
            if problem is None and per_rank[top] > one.value:
                problem = (top, s, per_rank[top], one)
            over = [r for r, b in enumerate(per_rank) if r != top and b > others.value]
            if problem is None and over:
                problem = (over[0], s, per_rank[over[0]], others)
            if problem is None and 0 in per_rank:
                problem = (per_rank.index(0), s, 0, None)
        total, step, rank = worst
        message = f"bytes each rank wrote ({'; '.join(rows)})"
        if problem is None:
            return Check(name, True, f"{message}: the most, rank {rank} in the save of step {step}, "
                         f"{fmt(total, 'bytes')}, within the budget {one.describe()}; every other rank within "
                         f"{others.describe()}", measured=total, budget=one)
        rank, step, nbytes, budget = problem
        if budget is None:
            return Check(name, False, f"{message}: rank {rank} wrote nothing in the save of step {step}; each rank "
                         f"writes its own shard", measured=nbytes, budget=one,
                         diagnosis="each rank writes its own shard of master, m and v (no rank holds another's)")
        return Check(name, False, f"{message}: rank {rank} wrote {fmt(nbytes, 'bytes')} in the save of step {step}, "
                     f"over the budget {budget.describe()}", measured=nbytes, budget=budget,
                     diagnosis=diagnose_bytes(nbytes, rank, budget is others))

    def check_reshard(self, reshard, ref) -> Check:
        name = "reshard 4 to 2"
        loaded = _loaded(reshard, "the resume on 2 ranks")
        if isinstance(loaded, Check):
            return Check(name, False, loaded.message, diagnosis=loaded.diagnosis)
        off = differences(loaded, ref["two_start"])
        if off:
            return Check(name, False, f"2 fresh ranks called load_checkpoint on the checkpoints 4 ranks wrote: "
                         f"{off[0]}" + _also(off),
                         diagnosis=diagnose_reshard(loaded, ref["two_start"], ref["fresh_generator"]))
        off = differences([r.get("final") for r in reshard["results"]], ref["two_final"])
        if off:
            return Check(name, False, f"2 ranks loaded step {SAVES[-1]} exactly, but at the end of step {STEPS}: "
                         f"{off[0]}")
        return Check(name, True, f"2 fresh ranks loaded step {SAVES[-1]} from the 4 ranks' shards (rank q: elements "
                     f"q·Ψ/2 to (q+1)·Ψ/2 of master, m and v, from the old shards 2q and 2q+1) and ran to step "
                     f"{STEPS} bit for bit as the grader's own run on 2 ranks from there")


# --------------------------------------------------------------------------------------------------------------
# Comparing pieces, and naming what differs.


def _also(off: list[str]) -> str:
    return f". Also: {'; '.join(off[1:4])}" + (f" and {len(off) - 4} more" if len(off) > 4 else "") if len(off) > 1 \
        else ""


def _steps(steps, sep=" and ") -> str:
    return sep.join(str(s) for s in steps)


def _loaded(resumed: dict, what: str):
    """Each rank's pieces right after load_checkpoint, or a failed Check saying why there are none."""
    if resumed.get("error"):
        return Check("", False, f"{what} failed: {resumed['error']}")
    results = resumed.get("results")
    if not isinstance(results, list):
        return Check("", False, f"{what} did not run")
    loaded = [(r or {}).get("loaded") for r in results]
    stopped = next(((r or {}).get("stopped") for r in results if (r or {}).get("stopped")), "")
    if stopped:
        return Check("", False, f"in {what}, after load_checkpoint {stopped}: no step can run on that",
                     diagnosis=diagnose_stopped(stopped, loaded))
    return loaded


def _common_step(loaded) -> int | str:
    steps = {(p or {}).get("step") for p in loaded}
    return steps.pop() if len(steps) == 1 else f"{sorted(map(str, steps))} (the ranks disagree)"


def _step_text(loaded) -> str:
    steps = [(p or {}).get("step") for p in loaded]
    if len(set(map(str, steps))) == 1:
        return f"step {steps[0]}" if steps[0] else "nothing (step 0: the state of a fresh process)"
    return "different steps on different ranks: " + ", ".join(f"rank {r}: {s}" for r, s in enumerate(steps))


def _describe_event(event: dict) -> str:
    what = {"write": f"halfway through writing {event['path']}", "rename": f"just before renaming {event['path']} "
            f"to {event['dst']}", "remove": f"just before removing {event['path']}",
            "makedirs": f"just before making the folder {event['path']}"}.get(event["op"], event["op"])
    return f"on rank {event['rank']} {what} (its change #{event['index']} in the save of step {jobs.POINTS_SAVE})"


def _left(point: dict) -> str:
    n = point.get("left", 0)
    return f" (the {n} crash points after this one were not run)" if n else ""


def _listing(listing: dict) -> str:
    shown = ", ".join(f"{p} ({n:,} bytes)" for p, n in list(listing.items())[:12])
    return (shown or "empty") + (f" and {len(listing) - 12} more files" if len(listing) > 12 else "")


# --------------------------------------------------------------------------------------------------------------
# Likely causes, only where the evidence singles one out.


def diagnose_load(loaded, expected, step, fresh_generator=None) -> str:
    steps = {(p or {}).get("step") for p in loaded}
    if len(steps) > 1:
        return ("the ranks loaded different checkpoints: each chose alone. Agree on one (an all_reduce of 'my "
                "shards check out' per candidate, MIN) so that every rank loads the same step")
    got_step = steps.pop()
    if got_step == 0 and step:
        return (f"nothing was loaded (the state is a fresh process's): load_checkpoint found no checkpoint it "
                f"accepted, although step {step}'s is whole")
    if isinstance(got_step, int) and got_step != step and got_step in SAVES:
        return (f"load_checkpoint restored step {got_step}, an older checkpoint than step {step}'s, which is whole: "
                f"load the newest complete checkpoint")
    if all(isinstance((p or {}).get("adam_steps"), int) and p["adam_steps"] == p.get("step") != e["adam_steps"]
           for p, e in zip(loaded, expected)):
        return ("Adam's step count was set to the loop's step, but a step skipped at an overflow is not one of "
                "Adam's (torch's GradScaler does not call optimizer.step() then): save state.adam_steps itself")
    fresh = _fresh_pieces(loaded, expected, fresh_generator)
    if fresh:
        return (f"{' and '.join(fresh)} still hold{'s' if len(fresh) == 1 else ''} what a fresh process starts with: "
                f"save {'it' if len(fresh) == 1 else 'them'} in the checkpoint and restore "
                f"{'it' if len(fresh) == 1 else 'them'} in load_checkpoint")
    rounded = all(isinstance((p or {}).get("master"), torch.Tensor) and p["master"].dtype == torch.float32 and
                  piece_mismatch(p["master"], e["master"]) and torch.equal(p["master"], e["master"].half().float())
                  for p, e in zip(loaded, expected))
    if rounded:
        return ("the master weights hold the float16 weights' values (the masters rounded to float16): restore the "
                "float32 master shard itself, which the checkpoint must hold; the float16 weights are rebuilt from "
                "it, never the other way")
    weights_only = all(piece_mismatch((p or {}).get("weights"), e["weights"]) and
                       not piece_mismatch((p or {}).get("master"), e["master"]) for p, e in zip(loaded, expected))
    if weights_only:
        return ("the master weights were restored, but not the float16 weights the forward runs on: call "
                "state.refresh_layers(dist) after restoring the masters")
    return ""


def _fresh_pieces(loaded, expected, fresh_generator=None) -> list[str]:
    """The pieces that differ from what they should be and equal what a fresh process starts with."""
    from ..p9_mixed_precision.serial import INIT_SCALE

    fresh_numbers = {"adam_steps": 0, "scale": INIT_SCALE, "good_steps": 0, "lr_step": 0, "position": 0, "step": 0}
    names = []
    for piece, value in fresh_numbers.items():
        if all((p or {}).get(piece) == value != e[piece] for p, e in zip(loaded, expected)):
            names.append(PIECES[piece])
    first = loaded[0] or {}
    if isinstance(first.get("order"), torch.Tensor) and torch.equal(first["order"], torch.arange(SAMPLES)) and \
            not torch.equal(expected[0]["order"], torch.arange(SAMPLES)):
        names.append(PIECES["order"])
    if fresh_generator is not None and all(isinstance((p or {}).get("generator"), torch.Tensor) and
                                           torch.equal(p["generator"], fresh_generator) for p in loaded):
        names.append(PIECES["generator"])
    for piece in ("m", "v"):
        if all(isinstance((p or {}).get(piece), torch.Tensor) and not p[piece].any() and e[piece].any()
               for p, e in zip(loaded, expected)):
            names.append(PIECES[piece])
    return names


def diagnose_point_error(point: dict, train) -> str:
    """A resume that failed after a crash: in the middle of a write that replaced a file the save before wrote (the
    same name: the last good checkpoint's file, overwritten in place), or after the loader read files of the
    checkpoint the crash left incomplete (so something told it that checkpoint was whole)."""
    event = point["event"]
    before = jobs.save_events(list(train), SAVES[-2])
    step_files = {name for name, _, _ in jobs.final_files(jobs.save_events(list(train), jobs.POINTS_SAVE))}
    read = list(dict.fromkeys(p for p in (point.get("resume") or {}).get("reads") or [] if p in step_files))
    if event["op"] == "write" and any(e["op"] == "write" and e["path"] == event["path"] for e in before):
        return (f"the save of step {jobs.POINTS_SAVE} wrote {event['path']} over the file of the same name that the "
                f"save of step {SAVES[-2]} wrote, and the crash left it half written: the last good checkpoint is "
                f"gone. Write each save under new names (a folder per step), each file under a temporary name "
                f"renamed once whole")
    if read:
        return (f"load_checkpoint read {', '.join(read[:3])}: files of step {jobs.POINTS_SAVE}'s checkpoint, which the "
                f"crash left incomplete (rank {event['rank']} died before its part of the save was done). Whatever "
                f"told the loader that checkpoint was whole (its manifest?) was written before every rank's shard "
                f"was: commit last, after an all-gather or a barrier that follows every rank's writes")
    return ""


def diagnose_stopped(stopped: str, loaded) -> str:
    if stopped.startswith("the ranks loaded different steps"):
        return ("each rank chose its checkpoint alone. Agree on one (an all_reduce, MIN, of 'the shards I need "
                "check out', for each candidate, newest first) so that every rank loads the same step")
    if "state.master is" in stopped and f"[{PSI // N}]" in stopped:
        return (f"on 2 ranks each holds Ψ/2 = {PSI // 2:,} elements: the saved shards 2q and 2q+1 joined (read the "
                f"manifest's world size, then every saved shard that overlaps your new range)")
    return ""


def diagnose_point(loaded, point, ref) -> str:
    if _common_step(loaded) == 0:
        listing = point["listing"]
        return (f"no checkpoint was left that load_checkpoint accepts. If the disk still holds the files of step "
                f"{SAVES[-2]}'s checkpoint ({len(listing)} files now), the loader rejected it; if not, they were "
                f"overwritten or removed before step {jobs.POINTS_SAVE}'s checkpoint was complete: write each save to "
                f"new names, and commit it last (a manifest renamed into place)")
    return diagnose_load(loaded, ref["at"][SAVES[-2]], SAVES[-2], ref["fresh_generator"])


def diagnose_bytes(total: int, rank: int, another: bool) -> str:
    shard = SHARD_BYTES
    if total >= N * shard:
        return (f"rank {rank} wrote at least every rank's shard ({N} x 12·Ψ/N): each rank writes only its own shard "
                f"of master, m and v")
    if total >= shard + 2 * PSI:
        return (f"rank {rank} wrote more than its shard by at least the float16 weights' 2·Ψ = {2 * PSI:,} bytes: "
                f"the weights are the masters rounded (state.refresh_layers rebuilds them), so write only the shard "
                f"of master, m and v")
    if another and total >= shard + GENERATOR_BYTES:
        return (f"rank {rank} wrote {total - shard:,} bytes beyond its shard, the size of the replicated state (the "
                f"generator's {GENERATOR_BYTES:,} bytes, the order) or of a manifest, while another rank wrote more "
                f"still: what every rank holds alike is written once, with the manifest, by the rank that commits "
                f"(several ranks writing one file at once is a race on a real disk)")
    return ""


def diagnose_reshard(loaded, expected, fresh_generator=None) -> str:
    first = loaded[0] or {}
    master = first.get("master")
    if isinstance(master, torch.Tensor) and master.numel() == PSI // N:
        return (f"rank 0 of 2 holds {master.numel():,} elements of the master weights, one saved shard's worth: on 2 "
                f"ranks each holds Ψ/2 = {PSI // 2:,}, the saved shards 2q and 2q+1 joined (read the manifest's "
                f"world size, then every saved shard that overlaps your new range)")
    return diagnose_load(loaded, expected, SAVES[-1], fresh_generator)


@functools.lru_cache(maxsize=4)
def control(seed: int) -> dict:
    """The grader's own job without a checkpoint: the state after every step on 4 ranks, and on 2 ranks from step
    4 (its shards joined and cut in two) to the end."""
    x, target, start = training.make_data(seed)
    args = (seed, x, target, start)
    program = jobs.program()
    four = sim.run(program, N, args=(jobs.CONTROL, Disk(), *args), cost=COST).results
    at = {s: [r["at"][s] for r in four] for s in jobs.CONTROL.records}
    two_start = training.resharded(at[SAVES[-1]], 2)
    two = sim.run(program, 2, args=(jobs.CONTROL_2, Disk(), *args), cost=COST,
                  rank_args=[(p,) for p in two_start]).results
    return {"at": at, "final": at[STEPS], "two_start": two_start, "two_final": [r["final"] for r in two],
            "fresh_generator": training.fresh_generator(seed)}


SPEC = Recovery()
