"""A disk every rank shares, and a rank that dies: what a checkpoint is written to, and what it must survive.

A training job writes its checkpoints to a filesystem that every process sees (a parallel filesystem, an object
store), and any process can die at any moment: a GPU falls off the bus, a node is preempted, the OOM killer picks
it. The job is then restarted, often on another number of machines, from whatever is on the disk. `Disk` is that
filesystem: it outlives the runs of a job (sim.run is one launch of the job), and `disk.mount(dist)` gives a rank
the calls a real program makes (os, open, torch.save), with the same meaning:

    fs.open(path, "wb")       a new, empty file (an old one of that name is truncated); .write(bytes), .close()
    fs.open(path, "rb")       .read(), .seek(), .tell(): torch.load(f) reads it, as it reads a real file
    fs.rename(src, dst)       atomic (os.replace): dst is the old file or the new one, never a mix of the two
    fs.remove(path)           fs.rmtree(path): every file in it, one remove after another, then the folders
    fs.makedirs(path, exist_ok=False)    fs.exists(path), fs.listdir(path) (sorted), fs.getsize(path)
    torch.save(obj, f) on a file open for writing, torch.load(f) on one open for reading (or on an io.BytesIO)

Paths are relative, with "/" between names ("ckpt/step_4/shard_0.pt"); the folder a file goes in must exist.

What survives when a process dies (kill -9, a segfault, a node that is gone):

    every byte a write() handed over     the operating system has it; the process's memory is not needed
    a write() under way                  its first bytes, not the rest: a file cut short
    a rename                             done or not done, never half (one directory entry changes)
    what the process still held          its tensors, anything not yet written: gone

So a file written in place can be found half written, and a file written under a temporary name and then renamed
is either absent or whole: that is how a checkpoint is committed. (A machine that loses power can lose more, such
as a renamed file's data that was never flushed with fsync: the checksums in a checkpoint's manifest catch that.)

Failure injection. `disk.start_run(crash=CrashPoint(rank, phase, index))` makes `rank` die at its index-th change to
the disk (0-based) in `phase` (a name the harness gives the call, "save 4"): a file being written dies with half of
its bytes written (`at_bytes`), a rename, remove or makedirs dies before it happens. `fs.crash()` kills the rank at
once (a failure between two steps). A dead rank's code unwinds with RankCrashed, and nothing it still tries reaches
the disk or another rank (failures.py refuses its `dist` calls); the other ranks run on until they wait for it, as
real processes run until a collective with a dead peer fails. The changes, in order, are the points at which a job
can die while it saves: `disk.events` lists them.

Bytes on the disk are not memory: they count on no memory ledger, but every byte is counted to the rank that writes
it (`disk.events`, `disk.written(rank, phase)`). A write or read of n bytes costs n / bytes_per_tick ticks and every
other call `latency_ticks` on the rank's compute stream (DISK: 8 bytes a tick, 8 GB/s, and 1,000 ticks, 1 µs, per
call), as a program that waits for its disk: a checkpoint written in the step's path stalls training.
grader/backends/real/ has the same calls on a real folder, and a real process killed at the same points.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
from dataclasses import dataclass, field

from . import guards
from .op_costs import OpCost
from .types import RankCrashed, RankThreadError


# --------------------------------------------------------------------------------------------------------------
# Paths, the disk's speed, what a change to the disk and a crash point are.


def normalize(path) -> str:
    """'ckpt/step_4/./shard_0.pt' -> 'ckpt/step_4/shard_0.pt'; '' is the disk's top folder. A path is relative and
    stays inside the disk (no leading '/', no '..'), on both backends."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"a path is a str, got a {type(path).__name__}")
    names = [n for n in path.split("/") if n not in ("", ".")]
    if path.startswith("/") or ".." in names:
        raise ValueError(f"{path!r}: paths are relative to the checkpoint disk, with no '..' (say 'ckpt/step_4/"
                         f"shard_0.pt')")
    return "/".join(names)


def parent(path: str) -> str:
    return path.rpartition("/")[0]


@dataclass(frozen=True)
class DiskProfile:
    """A disk's speed: bytes_per_tick for reads and writes, latency_ticks for every other call."""

    bytes_per_tick: int = 8
    latency_ticks: int = 1_000

    def ticks(self, nbytes: int = 0, call: bool = False) -> int:
        return (self.latency_ticks if call else 0) + -(-nbytes // self.bytes_per_tick)


DISK = DiskProfile()


@dataclass
class DiskEvent:
    """One change to the disk: op "write" (a file opened for writing, with the bytes written into it until it
    was closed), "rename" (path -> dst), "remove" or "makedirs"; by `rank`, in `phase`, at its `index`-th change in
    that phase. A file opened for reading is logged too, as op "read" with index -1 (not a change)."""

    rank: int
    phase: str
    index: int
    op: str
    path: str
    dst: str = ""
    nbytes: int = 0
    run: int = 0
    seq: int = 0  # its place among every rank's changes (the order they happened in)

    def describe(self) -> str:
        what = {"write": f"writing {self.path} ({self.nbytes:,} bytes)", "remove": f"removing {self.path}",
                "rename": f"renaming {self.path} to {self.dst}", "makedirs": f"making the folder {self.path}",
                "read": f"reading {self.path}"}[self.op]
        return f"rank {self.rank}, {self.phase}, change #{self.index}: {what}"

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class CrashPoint:
    """Where a rank dies: at its `index`-th change to the disk in `phase`; inside a write, once `at_bytes` of the
    file are written (half the file, by default: what a crash in the middle of writing leaves)."""

    rank: int
    phase: str
    index: int
    at_bytes: int = 0

    @classmethod
    def during(cls, event: DiskEvent) -> CrashPoint:
        return cls(event.rank, event.phase, event.index, event.nbytes // 2 if event.op == "write" else 0)


# --------------------------------------------------------------------------------------------------------------
# The disk: files and folders, shared by every rank and every run of a job.


@dataclass
class Disk:
    """Files (path -> bytes) and folders, the changes made to them, and an armed crash point. Shared by the ranks
    of a run and by the runs of a job: nothing here belongs to one process."""

    profile: DiskProfile = DISK
    files: dict = field(default_factory=dict)  # path -> bytearray
    folders: set = field(default_factory=lambda: {""})
    events: list = field(default_factory=list)  # DiskEvent, in the order they happened
    armed: CrashPoint | None = None
    crashed: CrashPoint | None = None  # the point that fired, in the run under way
    runs: int = 0

    def mount(self, dist) -> Files:
        """Rank `dist.get_rank()`'s view of the disk, for one run."""
        return Files(self, dist.get_rank())

    def start_run(self, crash: CrashPoint | None = None) -> None:
        """A new launch of the job begins (its changes are counted apart); it dies at `crash`, if given."""
        self.armed, self.crashed = crash, None
        self.runs += 1

    def copy(self) -> Disk:
        """The disk as it is now, to start another job from (its own files from here on)."""
        return Disk(self.profile, {p: bytearray(b) for p, b in self.files.items()}, set(self.folders),
                    copy.copy(self.events), runs=self.runs)

    def written(self, rank: int, phase: str | None = None) -> int:
        """The bytes `rank` wrote (in `phase`, if given) over every run."""
        return sum(e.nbytes for e in self.events if e.rank == rank and e.op == "write" and
                   (phase is None or e.phase == phase))

    def damage(self, path: str) -> None:
        """Flip one byte in the middle of a file, as a disk that loses power or rots one can: the file keeps its
        name and size."""
        data = self.files[normalize(path)]
        data[len(data) // 2] ^= 0xFF

    def listing(self) -> dict[str, int]:
        """{path: size} of every file."""
        return {p: len(b) for p, b in sorted(self.files.items())}


class Files:
    """One rank's calls on the disk (what `disk.mount(dist)` returns). Each call checks what os would check,
    counts the change it makes, costs its time on the rank's clock, and dies where the armed crash point says."""

    def __init__(self, disk: Disk, rank: int):
        self._disk, self._rank = disk, rank
        self._phase = ""
        self._changes: dict[str, int] = {}  # phase -> changes made in it
        self._dead = False
        guards.allow_files()  # torch.save's bytes go to this disk, which counts them: not memory to hide

    # ---- the harness's part: phases, and a crash between two steps

    @contextlib.contextmanager
    def phase(self, name: str):
        """Name the calls made inside (the harness says "save 4"): crash points and byte counts refer to it."""
        self._phase = name
        try:
            yield self
        finally:
            self._phase = ""

    def crash(self) -> None:
        """Die now (a failure between two steps)."""
        self._die(None)

    @property
    def dead(self) -> bool:
        """Whether this rank has died (an injected failure)."""
        return self._dead

    def events(self) -> list[DiskEvent]:
        return [e for e in self._disk.events if e.rank == self._rank and e.run == self._disk.runs]

    # ---- the learner's part: what os and open offer

    def open(self, path, mode: str = "rb"):
        path = self._live(path)
        self._cost(call=True)
        if mode == "rb":
            data = bytes(self._file(path))
            self._disk.events.append(DiskEvent(self._rank, self._phase, -1, "read", path, nbytes=len(data),
                                               run=self._disk.runs, seq=len(self._disk.events)))
            return _ReadFile(self, path, data)
        if mode != "wb":
            raise ValueError(f"fs.open({path!r}, {mode!r}): the checkpoint disk opens files for reading ('rb') or "
                             f"for writing a new file ('wb'), in binary")
        self._need_folder(parent(path), path)
        if path in self._disk.folders:
            raise IsADirectoryError(f"[Errno 21] Is a directory: {path!r}")
        event, crash_at = self._change("write", path)
        self._disk.files[path] = bytearray()
        out = _WriteFile(self, path, event, crash_at)
        if crash_at == 0:
            self._die(self._disk.armed)
        return out

    def rename(self, src, dst) -> None:
        src, dst = self._live(src), self._live(dst)
        self._cost(call=True)
        is_file, is_folder = src in self._disk.files, src in self._disk.folders
        if not (is_file or is_folder):
            raise FileNotFoundError(f"[Errno 2] No such file or directory: {src!r} -> {dst!r}")
        self._need_folder(parent(dst), dst)
        if is_file and dst in self._disk.folders:
            raise IsADirectoryError(f"[Errno 21] Is a directory: {src!r} -> {dst!r}")
        if is_folder:
            if dst in self._disk.files:
                raise NotADirectoryError(f"[Errno 20] Not a directory: {src!r} -> {dst!r}")
            if dst in self._disk.folders and self._children(dst):
                raise OSError(39, f"Directory not empty: {src!r} -> {dst!r}")
            if dst == src or dst.startswith(src + "/"):
                raise OSError(22, f"Invalid argument: {src!r} -> {dst!r}")
        self._change("rename", src, dst)
        if is_file:
            self._disk.files[dst] = self._disk.files.pop(src)
            return
        moved = [p for p in self._disk.files if p.startswith(src + "/")]
        for p in moved:
            self._disk.files[dst + p[len(src):]] = self._disk.files.pop(p)
        folders = [f for f in self._disk.folders if f == src or f.startswith(src + "/")]
        self._disk.folders.difference_update(folders)
        self._disk.folders.update(dst + f[len(src):] for f in folders)

    def remove(self, path) -> None:
        path = self._live(path)
        self._cost(call=True)
        if path in self._disk.folders:
            raise IsADirectoryError(f"[Errno 21] Is a directory: {path!r}")
        self._file(path)
        self._change("remove", path)
        del self._disk.files[path]

    def rmtree(self, path) -> None:
        """Every file under `path`, one remove at a time (a crash can stop it halfway), then its folders."""
        path = self._live(path)
        if path not in self._disk.folders:
            raise (NotADirectoryError if path in self._disk.files else FileNotFoundError)(
                f"No such directory: {path!r}")
        for p in sorted(p for p in self._disk.files if p.startswith(path + "/")):
            self.remove(p)
        for f in sorted((f for f in self._disk.folders if f == path or f.startswith(path + "/")), reverse=True):
            self._cost(call=True)
            self._change("remove", f)
            self._disk.folders.discard(f)

    def makedirs(self, path, exist_ok: bool = False) -> None:
        path = self._live(path)
        self._cost(call=True)
        if path in self._disk.folders and not exist_ok:
            raise FileExistsError(f"[Errno 17] File exists: {path!r}")
        missing, p = [], path
        while p not in self._disk.folders:
            if p in self._disk.files:
                raise FileExistsError(f"[Errno 17] File exists: {p!r}")
            missing.append(p)
            p = parent(p)
        self._change("makedirs", path)  # a change even when the folder is there: a call dies before it, or not
        self._disk.folders.update(missing)

    def exists(self, path) -> bool:
        path = self._live(path)
        self._cost(call=True)
        return path in self._disk.files or path in self._disk.folders

    def listdir(self, path="") -> list[str]:
        path = self._live(path)
        self._cost(call=True)
        if path not in self._disk.folders:
            raise (NotADirectoryError if path in self._disk.files else FileNotFoundError)(
                f"No such directory: {path!r}")
        return self._children(path)

    def getsize(self, path) -> int:
        path = self._live(path)
        self._cost(call=True)
        return len(self._file(path))

    # ---- underneath

    def _live(self, path) -> str:
        if self._dead:
            raise RankCrashed(f"rank {self._rank} is dead")
        if guards.caller() is None:  # another thread than the rank's: it would write outside the baton's turns
            raise RankThreadError(f"rank {self._rank}'s checkpoint disk was called from another thread than the "
                                  f"rank's own (or after its run): the simulator runs each rank in one thread; "
                                  f"write from the rank's own code")
        return normalize(path)

    def _file(self, path: str) -> bytearray:
        try:
            return self._disk.files[path]
        except KeyError:
            error = IsADirectoryError if path in self._disk.folders else FileNotFoundError
            raise error(f"No such file: {path!r}") from None

    def _need_folder(self, folder: str, path: str) -> None:
        if folder not in self._disk.folders:
            raise FileNotFoundError(f"[Errno 2] No such file or directory: {path!r} (make its folder first: "
                                    f"fs.makedirs({folder!r}, exist_ok=True))")

    def _children(self, folder: str) -> list[str]:
        prefix = folder + "/" if folder else ""
        names = {p[len(prefix):].split("/")[0] for p in (*self._disk.files, *self._disk.folders)
                 if p.startswith(prefix) and p != folder}
        return sorted(names)

    def _change(self, op: str, path: str, dst: str = "") -> tuple[DiskEvent, int | None]:
        """Count one change, and die first if it is the armed crash point; for a write, return the byte at which
        it dies (None: it does not)."""
        index = self._changes.get(self._phase, 0)
        self._changes[self._phase] = index + 1
        point = self._disk.armed
        hit = bool(self._phase) and point is not None and \
            (point.rank, point.phase, point.index) == (self._rank, self._phase, index)
        if hit and op != "write":
            self._die(point)
        event = DiskEvent(self._rank, self._phase, index, op, path, dst, run=self._disk.runs,
                          seq=len(self._disk.events))
        self._disk.events.append(event)
        return event, (point.at_bytes if hit else None)

    def _die(self, point: CrashPoint | None) -> None:
        self._dead = True
        self._disk.crashed = point or CrashPoint(self._rank, "between steps", -1)
        _mark_dead()
        raise RankCrashed(f"rank {self._rank} died (an injected failure" +
                          (f" at {point.phase}, change #{point.index})" if point else ")"))

    def _cost(self, nbytes: int = 0, call: bool = False, what: str = "") -> None:
        charge_io(self._disk.profile.ticks(nbytes, call), nbytes, what or ("disk call" if call else "disk i/o"))


class _WriteFile:
    """A file open for writing: every write() reaches the disk at once (there is no buffer to lose)."""

    def __init__(self, fs: Files, path: str, event: DiskEvent, crash_at: int | None):
        self._fs, self._path, self._event, self._crash_at = fs, path, event, crash_at
        self.closed = False
        self.name = path

    def write(self, data) -> int:
        if self.closed:
            raise ValueError("write to closed file")
        fs = self._fs
        fs._live(self._path)
        data = bytes(data)
        crash_at = self._crash_at
        if crash_at is not None and self._event.nbytes + len(data) >= crash_at:
            data = data[:crash_at - self._event.nbytes]
            self._append(data)
            fs._die(CrashPoint(self._event.rank, self._event.phase, self._event.index, crash_at))
        self._append(data)
        return len(data)

    def _append(self, data: bytes) -> None:
        self._fs._disk.files[self._path].extend(data)
        self._event.nbytes += len(data)
        self._fs._cost(len(data), what="write")

    def tell(self) -> int:
        return self._event.nbytes

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed and self._crash_at is not None and not self._fs._dead:
            # The file ended before the crash point's byte (it came out shorter this time): die at its end.
            self._fs._die(CrashPoint(self._event.rank, self._event.phase, self._event.index, self._event.nbytes))
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _ReadFile(io.BytesIO):
    """A file open for reading: the bytes it held when it was opened; each read costs its bytes' time."""

    def __init__(self, fs: Files, path: str, data: bytes):
        super().__init__(data)
        self._fs, self.name = fs, path

    def read(self, size=-1):
        self._fs._live(self.name)
        out = super().read(size)
        self._fs._cost(len(out), what="read")
        return out

    def readinto(self, buffer):
        self._fs._live(self.name)
        n = super().readinto(buffer)
        self._fs._cost(n, what="read")
        return n


# --------------------------------------------------------------------------------------------------------------
# Where the disk meets the rest of the simulator: the rank's clock, and a dead rank's `dist` (through guards.py's
# `caller`, the rank state of the thread: a real process's tracker on the real backend).


def charge_io(ticks: int, nbytes: int, what: str) -> None:
    """A disk call waits on the rank's compute stream (the program blocks on its disk), as an "io" event. The rank
    is the simulator's, or a real process's tracker (grader/backends/real/disk.py charges the same)."""
    who = guards.caller()
    if who is None or ticks <= 0:
        return
    label = who.labels[-1] if who.labels else ""
    who.clock.run_compute(who.rank, ticks, OpCost(0, nbytes, "io"), "io", label, what, who.site())


def _mark_dead() -> None:
    """From now on the rank's `dist` calls raise RankCrashed (failures.py): a dead process reaches no one."""
    who = guards.caller()
    if who is not None:
        who.crashed = True
