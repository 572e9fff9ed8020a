"""p18's job: the launches it is made of, what each rank runs in one, and the job itself.

A real training job is launched, dies, and is launched again, perhaps on fewer machines, from its checkpoints.
So p18 is graded on a job of several launches that share one disk, each launch a run of N processes (simulated
ranks, or real processes on gloo: a backend hands `job` a launcher that runs a Launch either way):

    control        the grader's own run, no checkpoint: the truth (spec.reference runs it, 4 ranks, then 2)
    train          4 ranks, 6 steps, save_checkpoint after steps 2 and 4: saving must change nothing (every
                   launch calls load_checkpoint first, as a job's script does at every start: here on an empty disk)
    crash          4 ranks: rank 2 dies at the start of step 5 (after the save of step 4)
      resume         4 fresh ranks: load_checkpoint, then steps 5 and 6
      reshard        2 fresh ranks on the same disk: load_checkpoint, then steps 5 and 6
    crash points   for every change a rank makes to the disk while it saves step 4 (the train launch lists them):
                   4 ranks that die there, then 4 fresh ranks that load and run to step 6
    damaged        the train launch's disk with one byte of rank 2's shard of step 4 flipped, then a resume

Each rank returns the pieces of its state (training.pieces) where they are compared: after each save,
right after load_checkpoint, and at the end. The comparisons are the spec's (spec.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from puzzles.sim import CrashPoint, RankCrashed
from puzzles.simulator.filesystem import DiskEvent

from . import training
from .training import N, SAVES, STEPS, differences

CRASH_RANK, CRASH_STEP = 2, 5  # the failure at a chosen step: rank 2 dies as step 5 begins
POINTS_SAVE = SAVES[-1]  # the save whose every change to the disk is a crash point (a good checkpoint before it)
DAMAGED_RANK = 2  # whose shard of the newest checkpoint the damaged disk flips a byte of


@dataclass(frozen=True)
class Launch:
    """One launch of the job: `world` ranks; load_checkpoint first if `load`; steps until `until`, saving after
    each step of `saves`; a rank dies at `crash` (a change to the disk) or at the start of step `crash_step`
    (rank, step); `control`: the grader's own run (no learner code), starting from given pieces if `start`."""

    name: str
    world: int = N
    load: bool = False
    until: int = STEPS
    saves: tuple = SAVES
    crash: CrashPoint | None = None
    crash_step: tuple | None = None
    control: bool = False
    records: tuple = SAVES  # steps after which each rank records its pieces (the control's truth)
    after_load: int | None = None  # steps to run after loading (None: until `until`)

    @property
    def dies(self) -> bool:
        return self.crash is not None or self.crash_step is not None


TRAIN = Launch("train", load=True)
CRASH = Launch("crash", load=True, crash_step=(CRASH_RANK, CRASH_STEP))
RESUME = Launch("resume", load=True, saves=())
RESHARD = Launch("reshard", world=2, load=True, saves=())
POINT = Launch("crash point", load=True, until=POINTS_SAVE)  # and its crash point
POINT_RESUME = Launch("resume", load=True, saves=(), after_load=1)  # one step from the loaded checkpoint
CONTROL = Launch("control", saves=(), control=True, records=tuple(range(STEPS + 1)))
CONTROL_2 = Launch("control", world=2, saves=(), control=True, records=())


def program(save=None, load=None):
    """What every rank runs in a launch: the harness around the learner's save_checkpoint and load_checkpoint."""

    def run(dist, launch, disk, seed, x, target, start, pieces_at_start=None):
        rank = dist.get_rank()
        fs = disk.mount(dist)
        if pieces_at_start is not None:
            state = training.state_from(pieces_at_start, seed)
        else:
            state = training.fresh_state(rank, dist.get_world_size(), start, seed)
        out = {"rank": rank, "launch": launch.name, "at": {}}
        try:
            if launch.load:
                with fs.phase("load"):
                    load(dist, fs, state)
                out["loaded"] = training.pieces(state)
                out["stopped"] = loaded_as_one(dist, state)
                if out["stopped"]:  # no step can run on this state: say why rather than fail in the grader's step
                    out["disk"] = [e.to_dict() for e in fs.events()]
                    return out
            if 0 in launch.records:
                out["at"][0] = training.pieces(state)
            until = launch.until if launch.after_load is None else state.step + launch.after_load
            while state.step < until:
                if launch.crash_step == (rank, state.step + 1):
                    fs.crash()
                training.train_step(dist, state, x, target)
                if state.step in launch.saves:
                    with fs.phase(f"save {state.step}"):
                        save(dist, fs, state)
                if state.step in launch.records:
                    out["at"][state.step] = training.pieces(state)
            out["final"] = training.pieces(state)
        except BaseException:
            if fs.dead:  # whatever the dying rank's code raised on its way out (torch.save's own RuntimeError...)
                raise RankCrashed(f"rank {rank} died") from None
            raise
        out["disk"] = [e.to_dict() for e in fs.events()]
        return out

    return run


def loaded_as_one(dist, state) -> str:
    """After load_checkpoint, on every rank: '' when every rank holds a state the step can run on, all at the same
    step; else what is wrong (the same words on every rank: the ranks compare notes by an all-gather)."""
    world = dist.get_world_size()
    problem = training.unusable(state, world)
    step = state.step if isinstance(state.step, int) and not isinstance(state.step, bool) else -1
    note = torch.tensor([0 if problem is None else 1, step], dtype=torch.int64)
    notes = torch.empty(2 * world, dtype=torch.int64)
    dist.all_gather_into_tensor(notes, note)
    bad, steps = notes.view(world, 2)[:, 0].tolist(), notes.view(world, 2)[:, 1].tolist()
    if problem is not None:
        return problem
    if any(bad):
        return f"rank {bad.index(1)} holds a state the step cannot run on"
    if len(set(steps)) > 1:
        return "the ranks loaded different steps: " + ", ".join(f"rank {r}: {s}" for r, s in enumerate(steps))
    return ""


@dataclass
class Resumed:
    """A launch that loads: each rank's results, or the error it raised instead (the text of it)."""

    results: list | None = None
    error: str = ""
    reads: list = field(default_factory=list)  # the files load_checkpoint opened, in order


@dataclass
class JobRecord:
    """What the job saw, for the checks: the train launch's per-rank results; the resume, reshard and damaged
    launches; each crash point's event and what became of it."""

    train: list
    resume: Resumed = field(default_factory=Resumed)
    reshard: Resumed = field(default_factory=Resumed)
    damaged: Resumed = field(default_factory=Resumed)
    damaged_file: str = ""
    damaged_listing: dict = field(default_factory=dict)  # the disk the damaged resume started from
    points: list = field(default_factory=list)  # {"event", "died", "listing", "resume": Resumed}

    def to_dict(self) -> dict:
        def resumed(r: Resumed) -> dict:
            return {"results": r.results, "error": r.error, "reads": r.reads}

        return {"resume": resumed(self.resume), "reshard": resumed(self.reshard), "damaged": resumed(self.damaged),
                "damaged_file": self.damaged_file, "damaged_listing": self.damaged_listing,
                "points": [{**p, "resume": resumed(p["resume"])} for p in self.points]}


def save_events(train_results: list, step: int) -> list[dict]:
    """The changes the ranks made to the disk while they saved `step`, in the order they happened."""
    phase = f"save {step}"
    return sorted((e for res in train_results for e in (res.get("disk") or []) if e["phase"] == phase
                   and e["op"] != "read"), key=lambda e: e["seq"])


def final_files(events: list[dict]) -> list[tuple[str, int, int]]:
    """(name, bytes, rank) of every file the changes `events` wrote that they leave on the disk, under the name it
    has at their end (after its renames and its folder's)."""
    files = {}  # the path it was written at -> [its name now, bytes, rank]
    for e in events:
        if e["op"] == "write":
            files[e["path"]] = [e["path"], e["nbytes"], e["rank"]]
        elif e["op"] == "rename":
            for entry in files.values():
                if entry[0] == e["path"] or entry[0].startswith(e["path"] + "/"):
                    entry[0] = e["dst"] + entry[0][len(e["path"]):]
        elif e["op"] == "remove":
            files = {k: v for k, v in files.items() if v[0] != e["path"]}
    return [tuple(v) for v in files.values()]


def surviving_file(events: list[dict], rank: int) -> str:
    """The largest file `rank` wrote (by any rank, if it wrote none) that the changes `events` leave on the disk."""
    files = final_files(events)
    mine = [(n, name) for name, n, r in files if r == rank]
    return max(mine or [(n, name) for name, n, _ in files], default=(0, ""))[1]


def job(launcher, control: dict) -> JobRecord:
    """Run the whole job through `launcher` (a backend's: run, die, new_disk, copy, damage, listing). `control` is
    the grader's own run (spec.reference): the crash points stop at the first whose resume is not exact (the check
    reports that one; the others would only repeat it, at a second each)."""
    disk = launcher.new_disk()
    record = JobRecord(train=launcher.run(TRAIN, disk))

    crashed = launcher.new_disk()
    launcher.die(CRASH, crashed)
    record.resume = _resume(launcher, RESUME, launcher.copy(crashed))
    record.reshard = _resume(launcher, RESHARD, crashed)

    damaged = launcher.copy(disk)
    record.damaged_file = surviving_file(save_events(record.train, POINTS_SAVE), DAMAGED_RANK)
    if record.damaged_file:
        launcher.damage(damaged, record.damaged_file)
    record.damaged_listing = launcher.listing(damaged)
    record.damaged = _resume(launcher, RESUME, damaged)

    events = save_events(record.train, POINTS_SAVE)
    for i, event in enumerate(events):
        disk = launcher.new_disk()
        point = CrashPoint.during(DiskEvent(**event))
        died = launcher.die(replace(POINT, crash=point), disk)
        if died:
            dodged(launcher, disk, point)
        entry = {"event": event, "died": died, "listing": launcher.listing(disk), "left": len(events) - i - 1}
        entry["resume"] = _resume(launcher, POINT_RESUME, disk) if died else Resumed()
        record.points.append(entry)
        if not (died and exact_resume(entry["resume"], control)):
            break
    return record


def dodged(launcher, disk, point: CrashPoint) -> None:
    """A rank that was to die at a change must have made no later change in that phase: one that did dodged its
    crash (an answer that reached the disk's armed point and disarmed it), and nothing about the run can be
    trusted: the launcher reports it as tampering."""
    later = [e for e in launcher.events(disk) if (e["rank"], e["phase"]) == (point.rank, point.phase)
             and e["index"] > point.index]
    if later:
        launcher.tampered(f"rank {point.rank} was to die at its change #{point.index} of the {point.phase}, yet it "
                          f"made change #{later[0]['index']} ({later[0]['op']} {later[0]['path']}) after it: the "
                          f"injected failure was dodged")


def exact_resume(resumed: Resumed, control: dict) -> bool:
    """Whether a resume loaded a checkpoint's step on every rank, equal to the control's there, and ran its step
    after it as the control did."""
    if resumed.error or not resumed.results:
        return False
    loaded = [r.get("loaded") or {} for r in resumed.results]
    step = loaded[0].get("step")
    if step not in SAVES or any(p.get("step") != step for p in loaded):
        return False
    return not (differences(loaded, control["at"][step]) or
                differences([r.get("final") for r in resumed.results], control["at"][step + 1]))


def _resume(launcher, launch: Launch, disk) -> Resumed:
    try:
        resumed = Resumed(results=launcher.run(launch, disk))
    except launcher.learner_errors as exc:  # the learner's code raised or hung: that is this scenario's outcome
        resumed = Resumed(error=launcher.describe(exc))
    resumed.reads = launcher.reads(disk)
    return resumed
