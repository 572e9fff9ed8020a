"""The checkpoint disk and injected failures (puzzles/simulator/filesystem.py; grader/backends/real/disk.py on real
processes): what a call does and refuses, what a crash leaves on the disk, what a dead rank can still do, who is
charged for the bytes, and what the disk costs on the clock."""

from __future__ import annotations

import io
import math
import tempfile
import threading

import pytest
import torch

from puzzles import sim
from puzzles.sim import CrashPoint, Disk, HiddenMemoryError, RankCrashed
from puzzles.simulator.filesystem import DISK


def rank_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("sim-rank")]


def shards(dist, disk, phase="save 1"):
    """Each rank writes its shard under a temporary name and renames it; rank 0 then commits a manifest."""
    fs = disk.mount(dist)
    rank = dist.get_rank()
    with fs.phase(phase):
        if rank == 0:
            fs.makedirs("ckpt/a", exist_ok=True)
        dist.barrier()
        buf = io.BytesIO()
        torch.save({"w": torch.full((100,), float(rank))}, buf)
        with fs.open(f"ckpt/a/{rank}.tmp", "wb") as f:
            f.write(buf.getvalue())
        fs.rename(f"ckpt/a/{rank}.tmp", f"ckpt/a/{rank}.pt")
        dist.barrier()
        if rank == 0:
            with fs.open("ckpt/a/manifest.tmp", "wb") as f:
                f.write(b"whole")
            fs.rename("ckpt/a/manifest.tmp", "ckpt/a/manifest")
    return [e.to_dict() for e in fs.events()]


def test_files_are_shared_by_the_ranks_and_outlive_the_run():
    disk = Disk()
    disk.start_run()
    sim.run(shards, 3, args=(disk,))

    def read_neighbour(dist, disk):
        fs = disk.mount(dist)
        with fs.open(f"ckpt/a/{(dist.get_rank() + 1) % 3}.pt", "rb") as f:
            got = torch.load(io.BytesIO(f.read()), weights_only=True)["w"]
        return got[0].item(), sim.current_ledger().current >= got.numel() * 4

    disk.start_run()
    assert sim.run(read_neighbour, 3, args=(disk,)).results == [(1.0, True), (2.0, True), (0.0, True)]
    assert sorted(disk.listing()) == ["ckpt/a/0.pt", "ckpt/a/1.pt", "ckpt/a/2.pt", "ckpt/a/manifest"]


def test_torch_save_needs_a_mounted_disk():
    """The guard against memory hidden from the ledger holds in every other puzzle: torch.save's bytes are allowed
    only on a rank that writes to a checkpoint disk, which counts them."""
    def save(dist, disk=None):
        if disk is not None:
            disk.mount(dist)
        buf = io.BytesIO()
        torch.save(torch.ones(1000), buf)
        return len(buf.getvalue())

    with pytest.raises(HiddenMemoryError, match="without a checkpoint disk"):
        sim.run(save, 1)
    assert sim.run(save, 1, args=(Disk(),)).results[0] > 4000


def test_each_change_is_counted_to_its_rank_in_its_phase():
    disk = Disk()
    disk.start_run()
    events = sim.run(shards, 2, args=(disk,)).results
    assert [(e["op"], e["index"]) for e in events[0]] == [("makedirs", 0), ("write", 1), ("rename", 2),
                                                          ("write", 3), ("rename", 4)]
    assert [(e["op"], e["index"], e["path"], e["dst"]) for e in events[1]] == [
        ("write", 0, "ckpt/a/1.tmp", ""), ("rename", 1, "ckpt/a/1.tmp", "ckpt/a/1.pt")]
    size = disk.listing()["ckpt/a/1.pt"]
    assert events[1][0]["nbytes"] == size and disk.written(1, "save 1") == size
    assert disk.written(0, "save 1") == size + len(b"whole") and disk.written(0, "save 2") == 0


def test_what_os_refuses_the_disk_refuses():
    def calls(dist, disk):
        fs, out = disk.mount(dist), []
        for what, call in [("no folder", lambda: fs.open("x/y.pt", "wb")),
                           ("dotdot", lambda: fs.exists("../etc")), ("absolute", lambda: fs.exists("/etc")),
                           ("text mode", lambda: fs.open("a.txt", "w")),
                           ("read missing", lambda: fs.open("nothing", "rb")),
                           ("exists already", lambda: fs.makedirs("d"))]:
            if what == "exists already":
                fs.makedirs("d")
            try:
                call()
                out.append((what, None))
            except Exception as exc:
                out.append((what, type(exc).__name__))
        fs.makedirs("d", exist_ok=True)
        fs.makedirs("d/e/f", exist_ok=True)
        with fs.open("d/z", "wb") as f:
            f.write(b"zz")
        with fs.open("d/a", "wb") as f:
            f.write(b"a")
        out.append(("listdir", fs.listdir("d")))
        fs.rename("d/a", "d/z")  # replaces, as os.replace does
        out.append(("replaced", (fs.listdir("d"), fs.getsize("d/z"))))
        for what, call in [("remove a folder", lambda: fs.remove("d/e")),
                           ("folder onto a full folder", lambda: fs.rename("d/e", "d")),
                           ("file onto a folder", lambda: fs.rename("d/z", "d/e"))]:
            try:
                call()
                out.append((what, None))
            except Exception as exc:
                out.append((what, type(exc).__name__))
        fs.rename("d/e", "g")  # a folder moves with everything in it
        out.append(("moved", (fs.exists("g/f"), fs.exists("d/e"))))
        fs.rmtree("g")
        out.append(("rmtree", fs.exists("g")))
        return out

    assert dict(sim.run(calls, 1, args=(Disk(),)).results[0]) == {
        "no folder": "FileNotFoundError", "dotdot": "ValueError", "absolute": "ValueError", "text mode": "ValueError",
        "read missing": "FileNotFoundError", "exists already": "FileExistsError", "listdir": ["a", "e", "z"],
        "replaced": (["e", "z"], 1), "remove a folder": "IsADirectoryError", "folder onto a full folder": "OSError",
        "file onto a folder": "IsADirectoryError", "moved": (True, False), "rmtree": False}


def crash_run(point, world=3):
    disk = Disk()
    disk.start_run(point)
    with pytest.raises(RankCrashed):
        sim.run(shards, world, args=(disk,))
    assert rank_threads() == []
    return disk


def test_a_rank_that_dies_in_a_write_leaves_the_bytes_it_wrote_and_the_others_run_on():
    """Rank 1 dies halfway through its shard: the file holds exactly its first half; ranks 0 and 2 wrote and renamed
    theirs (they ran on until the barrier that waits for rank 1), and nobody wrote the manifest."""
    whole = Disk()
    whole.start_run()
    sim.run(shards, 3, args=(whole,))
    size = whole.listing()["ckpt/a/1.pt"]
    disk = crash_run(CrashPoint(1, "save 1", 0, size // 2))
    assert disk.listing() == {"ckpt/a/0.pt": size, "ckpt/a/1.tmp": size // 2, "ckpt/a/2.pt": size}
    assert bytes(disk.files["ckpt/a/1.tmp"]) == bytes(whole.files["ckpt/a/1.pt"][:size // 2])
    assert disk.crashed == CrashPoint(1, "save 1", 0, size // 2)


def test_a_rename_is_done_or_not_done():
    disk = crash_run(CrashPoint(2, "save 1", 1))  # rank 2 dies just before its rename
    assert "ckpt/a/2.tmp" in disk.listing() and "ckpt/a/2.pt" not in disk.listing()
    disk = crash_run(CrashPoint(0, "save 1", 4))  # rank 0 dies just before the commit
    assert "ckpt/a/manifest.tmp" in disk.listing() and "ckpt/a/manifest" not in disk.listing()


def test_a_dead_rank_reaches_neither_the_disk_nor_the_others():
    """A rank whose code catches the crash (except BaseException) still cannot write or communicate: each call
    raises RankCrashed again, as nothing runs in a process that is gone."""
    def stubborn(dist, disk):
        fs = disk.mount(dist)
        tries = []
        with fs.phase("p"):
            try:
                fs.makedirs("a")
            except BaseException:
                pass
            for call in (lambda: fs.exists("a"), lambda: fs.open("b", "wb"), lambda: dist.barrier()):
                try:
                    call()
                    tries.append("went through")
                except RankCrashed:
                    tries.append("refused")
        return tries

    disk = Disk()
    disk.start_run(CrashPoint(0, "p", 0))
    assert sim.run(stubborn, 1, args=(disk,)).results == [["refused", "refused", "refused"]]
    assert disk.listing() == {} and disk.folders == {""}


def test_a_failure_between_two_steps():
    def step_then_die(dist, disk):
        fs = disk.mount(dist)
        t = torch.ones(4)
        dist.all_reduce(t)
        if dist.get_rank() == 1:
            fs.crash()
        dist.all_reduce(t)
        return t

    disk = Disk()
    disk.start_run()
    with pytest.raises(RankCrashed, match="rank 1 died"):
        sim.run(step_then_die, 2, args=(disk,))
    assert disk.crashed.rank == 1 and rank_threads() == []


def test_a_copy_is_a_disk_of_its_own_and_damage_flips_one_byte():
    disk = Disk()
    disk.start_run()
    sim.run(shards, 2, args=(disk,))
    other = disk.copy()
    other.damage("ckpt/a/0.pt")
    a, b = bytes(disk.files["ckpt/a/0.pt"]), bytes(other.files["ckpt/a/0.pt"])
    assert len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1 and a[len(a) // 2] == b[len(b) // 2] ^ 0xFF


def test_the_disk_costs_its_time_on_the_compute_stream():
    """A write of n bytes costs n / 8 ticks (8 GB/s), every other call 1,000 ticks, as "io" events."""
    def write(dist, disk):
        fs = disk.mount(dist)
        with fs.open("f", "wb") as f:  # one call
            f.write(b"x" * 1000)
            f.write(b"y" * 3)
        with fs.open("f", "rb") as f:  # one call, and a read of 1,003 bytes
            f.read()

    result = sim.run(write, 1, args=(Disk(),))
    io_events = [e for e in result.events if e.kind == "io"]
    ticks = sum(e.ticks for e in io_events)
    assert DISK.bytes_per_tick == 8 and DISK.latency_ticks == 1_000
    assert ticks == 2 * 1_000 + math.ceil(1000 / 8) + math.ceil(3 / 8) + math.ceil(1003 / 8)
    assert all(e.stream == "compute" and e.flops == 0 for e in io_events)


# ---- the same on real processes (grader/backends/real/disk.py)


def real_shards(dist, disk):
    return shards(dist, disk)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_real_processes_write_and_die_as_the_simulated_ranks_do():
    """The same program on gloo processes, a real folder, and a process ended by os._exit halfway through its write:
    the same changes, the same files, the same half-written bytes."""
    from grader.backends import real
    from grader.backends.real.disk import RealDisk

    sim_disk = Disk()
    sim_disk.start_run()
    sim.run(shards, 3, args=(sim_disk,))
    size = sim_disk.listing()["ckpt/a/1.pt"]
    with tempfile.TemporaryDirectory() as folder:
        whole = RealDisk.new(folder)
        whole.start_run()
        outcome = real.run(real_shards, 3, args=(whole,))
        assert outcome.ok, outcome.error
        assert whole.listing() == sim_disk.listing()
        strip = [[{k: v for k, v in e.items() if k != "seq"} for e in p["result"]] for p in outcome.payloads]
        simulated = [[{k: v for k, v in e.to_dict().items() if k != "seq"} for e in sim_disk.events if e.rank == r]
                     for r in range(3)]
        assert strip == simulated

        dying = RealDisk.new(folder)
        dying.start_run(CrashPoint(1, "save 1", 0, size // 2))
        outcome = real.run(real_shards, 3, args=(dying,))
        assert not outcome.ok and dying.crashed()
        assert dying.listing() == {"ckpt/a/0.pt": size, "ckpt/a/1.tmp": size // 2, "ckpt/a/2.pt": size}
        with open(f"{dying.root}/ckpt/a/1.tmp", "rb") as f:
            assert f.read() == bytes(sim_disk.files["ckpt/a/1.pt"][:size // 2])


def test_another_thread_cannot_reach_the_disk():
    """Writing from another thread (an asynchronous save) would change the disk outside the baton's turns, so the
    order of the ranks' changes, and with it every crash point, would differ from run to run: refused. (A rank
    may start no thread itself (allowed.py): the thread here is started before the run and handed the disk.)"""
    import queue

    from puzzles.sim import RankThreadError

    handed, done, caught = queue.Queue(), queue.Queue(), []

    def save():
        fs = handed.get()
        try:
            with fs.open("x", "wb") as f:
                f.write(b"late")
        except RankThreadError as exc:
            caught.append(str(exc))
        finally:
            done.put(None)

    worker = threading.Thread(target=save, daemon=True)
    worker.start()

    def threaded(dist, disk):
        handed.put(disk.mount(dist))
        done.get()

    sim.run(threaded, 1, args=(Disk(),))
    worker.join()
    assert len(caught) == 1 and "from another thread than the rank's own" in caught[0]


def test_a_rank_cannot_start_a_thread_to_save():
    from puzzles.sim import RankThreadError

    def threaded(dist, disk):
        fs = disk.mount(dist)

        def save():
            with fs.open("x", "wb") as f:
                f.write(b"late")

        worker = threading.Thread(target=save)
        worker.start()
        worker.join()

    with pytest.raises(RankThreadError, match="started a thread"):
        sim.run(threaded, 1, args=(Disk(),))
