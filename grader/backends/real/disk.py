"""The simulator's checkpoint disk on real processes: a folder on this machine's disk, and a process that dies.

`RealDisk` is what a launch hands each process (it pickles: a folder's path, a side folder for the grader's logs,
and the armed crash point); `disk.mount(dist)` gives the rank the calls of puzzles/simulator/filesystem.py, here
done by the operating system on the files of the folder, with the same meaning:

    fs.open(path, "wb")      a real file opened unbuffered: every write() reaches the kernel at once, so a process
                             that dies keeps every byte it wrote, as on the simulator's disk
    fs.rename(src, dst)      os.replace, atomic
    a crash point            the process writes the first at_bytes of its file (a write cut in two) or nothing (a
                             rename, remove or makedirs not yet done), notes that it died (the side folder), and
                             ends with os._exit(CRASH_EXIT): no cleanup, no `finally`, as kill -9
    fs.crash()               the same, between two steps

Every change (and every file opened for reading) is logged to the side folder, one JSON line per event, so that the
grader reads what a launch did even when its processes died. Each call costs the simulator's disk time on the
process's tracked clock (its compute laid end to end), so that the two backends' figures agree.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from puzzles.simulator import guards
from puzzles.simulator.filesystem import DISK, CrashPoint, DiskEvent, DiskProfile, charge_io, normalize

CRASH_EXIT = 86  # a process that died at its crash point (group.py waits for the others, as for a real failure)


@dataclass
class RealDisk:
    """A checkpoint disk of a job on real processes: its files live in `root`, the grader's logs in `side`."""

    root: str
    side: str
    run: int = 0
    crash: CrashPoint | None = None
    profile: DiskProfile = DISK

    @classmethod
    def new(cls, parent: str) -> RealDisk:
        folder = tempfile.mkdtemp(prefix="disk-", dir=parent)
        os.makedirs(os.path.join(folder, "files"))
        os.makedirs(os.path.join(folder, "logs"))
        return cls(os.path.join(folder, "files"), os.path.join(folder, "logs"))

    def mount(self, dist) -> RealFiles:
        return RealFiles(self, dist.get_rank())

    def start_run(self, crash: CrashPoint | None = None) -> None:
        self.run, self.crash = self.run + 1, crash

    # ---- the grader's side, in the parent process

    def copy(self, parent: str) -> RealDisk:
        other = RealDisk.new(parent)
        shutil.rmtree(other.root)
        shutil.copytree(self.root, other.root)
        other.run = self.run
        return other

    def damage(self, path: str) -> None:
        full = os.path.join(self.root, normalize(path))
        with open(full, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(size // 2)
            byte = f.read(1)
            f.seek(size // 2)
            f.write(bytes([byte[0] ^ 0xFF]))

    def listing(self) -> dict[str, int]:
        out = {}
        for folder, _, names in os.walk(self.root):
            for name in names:
                full = os.path.join(folder, name)
                out[os.path.relpath(full, self.root).replace(os.sep, "/")] = os.path.getsize(full)
        return dict(sorted(out.items()))

    def events(self) -> list[DiskEvent]:
        """Every event of the current run, in the order it happened (logged by each process as it went)."""
        out = {}
        for log in sorted(Path(self.side).glob(f"run{self.run}.r*.jsonl")):
            for line in log.read_text().splitlines():
                with contextlib.suppress(ValueError, TypeError):
                    fields = json.loads(line)
                    fields.pop("closed", None)  # a write's line again, with its size, once it was closed
                    out[fields["rank"], fields["seq"]] = DiskEvent(**fields)
        return sorted(out.values(), key=lambda e: e.seq)

    def crashed(self) -> bool:
        return any(Path(self.side).glob(f"run{self.run}.crashed.r*"))


class RealFiles:
    """One process's calls on a RealDisk: what os does, logged, and the process ended at its crash point."""

    def __init__(self, disk: RealDisk, rank: int):
        self._disk, self._rank = disk, rank
        self._phase = ""
        self._changes: dict[str, int] = {}
        self._events: list[DiskEvent] = []
        self._log = open(os.path.join(disk.side, f"run{disk.run}.r{rank}.jsonl"), "a", buffering=1)
        guards.allow_files()
        self.dead = False  # a process that dies does not come back to say so

    @contextlib.contextmanager
    def phase(self, name: str):
        self._phase = name
        try:
            yield self
        finally:
            self._phase = ""

    def crash(self) -> None:
        self._die()

    def events(self) -> list[DiskEvent]:
        return list(self._events)

    # ---- the learner's calls

    def open(self, path, mode: str = "rb"):
        full = self._full(path)
        self._cost(call=True)
        if mode == "rb":
            f = open(full, "rb")
            self._note("read", path, index=-1, nbytes=os.fstat(f.fileno()).st_size)
            return _RealReadFile(self, f)
        if mode != "wb":
            raise ValueError(f"fs.open({path!r}, {mode!r}): the checkpoint disk opens files for reading ('rb') or "
                             f"for writing a new file ('wb'), in binary")
        if not os.path.isdir(os.path.dirname(full)):
            raise FileNotFoundError(f"[Errno 2] No such file or directory: {normalize(path)!r} (make its folder "
                                    f"first: fs.makedirs(..., exist_ok=True))")
        event, crash_at = self._change("write", path)
        raw = open(full, "wb", buffering=0)
        out = _RealWriteFile(self, raw, event, crash_at)
        if crash_at == 0:
            self._die()
        return out

    def rename(self, src, dst) -> None:
        full_src, full_dst = self._full(src), self._full(dst)
        self._cost(call=True)
        if not os.path.exists(full_src):
            raise FileNotFoundError(f"[Errno 2] No such file or directory: {normalize(src)!r} -> {normalize(dst)!r}")
        self._change("rename", src, dst)
        os.replace(full_src, full_dst)

    def remove(self, path) -> None:
        full = self._full(path)
        self._cost(call=True)
        if os.path.isdir(full):
            raise IsADirectoryError(f"[Errno 21] Is a directory: {normalize(path)!r}")
        if not os.path.exists(full):
            raise FileNotFoundError(f"No such file: {normalize(path)!r}")
        self._change("remove", path)
        os.remove(full)

    def rmtree(self, path) -> None:
        full = self._full(path)
        if not os.path.isdir(full):
            raise (NotADirectoryError if os.path.exists(full) else FileNotFoundError)(
                f"No such directory: {normalize(path)!r}")
        files, folders = [], []
        for folder, subfolders, names in os.walk(full):
            files += [os.path.join(folder, n) for n in names]
            folders.append(folder)
        for f in sorted(files):
            self.remove(os.path.relpath(f, self._disk.root).replace(os.sep, "/"))
        for f in sorted(folders, reverse=True):
            self._cost(call=True)
            self._change("remove", os.path.relpath(f, self._disk.root).replace(os.sep, "/"))
            os.rmdir(f)

    def makedirs(self, path, exist_ok: bool = False) -> None:
        full = self._full(path)
        self._cost(call=True)
        if os.path.isdir(full) and not exist_ok:
            raise FileExistsError(f"[Errno 17] File exists: {normalize(path)!r}")
        self._change("makedirs", path)
        os.makedirs(full, exist_ok=True)

    def exists(self, path) -> bool:
        self._cost(call=True)
        return os.path.exists(self._full(path))

    def listdir(self, path="") -> list[str]:
        full = self._full(path)
        self._cost(call=True)
        return sorted(os.listdir(full))

    def getsize(self, path) -> int:
        full = self._full(path)
        self._cost(call=True)
        return os.path.getsize(full)

    # ---- underneath

    def _full(self, path) -> str:
        return os.path.join(self._disk.root, normalize(path))

    def _note(self, op: str, path, dst="", index: int = -1, nbytes: int = 0) -> DiskEvent:
        event = DiskEvent(self._rank, self._phase, index, op, normalize(path), normalize(dst) if dst else "",
                          nbytes, self._disk.run, time.monotonic_ns())
        self._events.append(event)
        self._log.write(json.dumps(event.to_dict()) + "\n")
        return event

    def _change(self, op: str, path, dst="") -> tuple[DiskEvent, int | None]:
        index = self._changes.get(self._phase, 0)
        self._changes[self._phase] = index + 1
        point = self._disk.crash
        hit = bool(self._phase) and point is not None and \
            (point.rank, point.phase, point.index) == (self._rank, self._phase, index)
        if hit and op != "write":
            self._die()
        return self._note(op, path, dst, index), (point.at_bytes if hit else None)

    def _written(self, event: DiskEvent, n: int) -> None:
        """A write's bytes, added to its event (the log gets the file's final size when it is closed)."""
        event.nbytes += n
        self._cost(n, what="write")

    def _cost(self, nbytes: int = 0, call: bool = False, what: str = "") -> None:
        charge_io(self._disk.profile.ticks(nbytes, call), nbytes, what or ("disk call" if call else "disk i/o"))

    def _die(self) -> None:
        Path(self._disk.side, f"run{self._disk.run}.crashed.r{self._rank}").touch()
        self._log.flush()
        os._exit(CRASH_EXIT)


class _RealReadFile:
    """A real file open for reading; each read costs its bytes' time."""

    def __init__(self, fs: RealFiles, raw):
        self._fs, self._raw, self.name = fs, raw, raw.name

    def read(self, size=-1):
        out = self._raw.read(size)
        self._fs._cost(len(out), what="read")
        return out

    def readinto(self, buffer):
        n = self._raw.readinto(buffer)
        self._fs._cost(n, what="read")
        return n

    def __getattr__(self, name):  # seek, tell, close, readable, seekable, fileno, closed ...
        return getattr(self._raw, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._raw.close()


class _RealWriteFile:
    """A file open for writing, unbuffered: each write() is the kernel's at once."""

    def __init__(self, fs: RealFiles, raw, event: DiskEvent, crash_at: int | None):
        self._fs, self._raw, self._event, self._crash_at = fs, raw, event, crash_at
        self.name = event.path

    @property
    def closed(self) -> bool:
        return self._raw.closed

    def write(self, data) -> int:
        data = bytes(data)
        crash_at = self._crash_at
        if crash_at is not None and self._event.nbytes + len(data) >= crash_at:
            self._all(data[:crash_at - self._event.nbytes])
            self._fs._die()
        self._all(data)
        return len(data)

    def _all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._raw.write(view)
            view = view[n:]
        self._fs._written(self._event, len(data))

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
        if not self._raw.closed:
            if self._crash_at is not None:  # the file ended before its crash point's byte: die at its end
                self._fs._die()
            self._raw.close()
            self._fs._log.write(json.dumps({**self._event.to_dict(), "closed": True}) + "\n")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
