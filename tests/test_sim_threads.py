"""A rank may start no thread and no process (allowed.py), and only a rank's own thread may call its `dist`: another
thread, another rank's thread, or the caller of sim.run after the run get RankThreadError, never an internal error. Once a run has stopped, every dist call and
tensor op in a rank's thread raises, and a thread that catches even that is stopped again until it ends."""

import _thread
import concurrent.futures
import multiprocessing
import os
import queue
import subprocess
import sys
import threading
import time

import pytest
import torch
from sim_helpers import site_in

from puzzles import sim


def site(marker: str) -> str:
    return site_in(__file__, marker)


def rank_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("sim-rank")]


def started_outside_the_rank(helper, name="my-helper"):
    """A thread the test starts before the run (a rank may start none: allowed.py), given rank 0's dist and a
    tensor through a queue; rank 0 waits until the helper is done (the returned queue), whatever it raised."""
    handed, done = queue.Queue(), queue.Queue()

    def run():
        try:
            helper(*handed.get())
        finally:
            done.put(None)

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return t, handed, done


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("swallow", [False, True])
def test_another_thread_that_calls_dist_is_refused_even_if_it_swallows_the_error(swallow):
    def helper(dist, x):
        try:
            dist.all_reduce(x)  # from-helper
        except Exception:
            if not swallow:
                raise

    t, handed, done = started_outside_the_rank(helper)

    def fn(dist):
        x = torch.ones(2, dtype=torch.float64)
        if dist.get_rank() == 0:
            handed.put((dist, x))
            done.get()
        dist.barrier()

    with pytest.raises(sim.RankThreadError) as info:
        sim.run(fn, 2)
    t.join()
    text = str(info.value)
    assert "rank 0 called all_reduce" in text and site("from-helper") in text and "'my-helper'" in text
    assert "call dist from the rank's function itself" in text and rank_threads() == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_another_thread_racing_the_rank_gets_a_clear_error():
    """The helper calls dist while its rank is itself in a collective: RankThreadError, not an internal one."""
    started = threading.Event()

    def helper(dist, y):
        started.set()
        dist.all_reduce(y)

    t, handed, done = started_outside_the_rank(helper, "racer")

    def fn(dist):
        x, y = torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
        if dist.get_rank() == 0:
            handed.put((dist, y))
            started.wait()
        dist.all_reduce(x)
        if dist.get_rank() == 0:
            done.get()

    with pytest.raises(sim.RankThreadError):
        sim.run(fn, 2)
    t.join()
    assert rank_threads() == []


STARTS = {
    "threading.Thread.start": lambda: threading.Thread(target=lambda: None).start(),
    "_thread.start_new_thread": lambda: _thread.start_new_thread(lambda: None, ()),
    "threading.Thread.start)": lambda: concurrent.futures.ThreadPoolExecutor(1).submit(lambda: 1).result(),
    "subprocess": lambda: subprocess.run(["true"], check=False),
    "os.system": lambda: os.system("true"),
    "os.fork": lambda: os.fork(),
    "multiprocessing or subprocess": lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    "os.posix_spawn": lambda: os.posix_spawn("/bin/true", ["true"], {}),
}


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes")
@pytest.mark.parametrize("how", sorted(STARTS), ids=lambda h: h.strip(")"))
def test_a_rank_may_start_no_thread_and_no_process(how):
    """The clock and the ledger watch one thread per rank (allowed.py): a thread or a process that a rank starts,
    by any of the standard library's ways, is refused where it is started, with why and what to do instead."""
    def fn(dist):
        if dist.get_rank() == 1:
            STARTS[how]()
        dist.barrier()

    before = threading.active_count()
    with pytest.raises(sim.RankThreadError) as info:
        sim.run(fn, 2)
    text = str(info.value)
    assert "rank 1 started a" in text and how in text and "test_sim_threads.py:" in text, text  # (STARTS' line)
    assert "neither timed nor counted" in text and rank_threads() == []
    assert threading.active_count() <= before


SPOOFED = {  # code made under a file name that would pass for another's (allowed.py's CODE_EVENTS)
    "the simulator's": lambda: os.path.join(os.path.dirname(sim.__file__), "simulator", "mode.py"),
    "torch's": lambda: torch.__file__,
    "Python's": lambda: threading.__file__,
    "frozen importlib's": lambda: "<frozen importlib._bootstrap>",
    "the simulator's, relative": lambda: os.path.relpath(os.path.join(os.path.dirname(sim.__file__), "simulator",
                                                                      "mode.py")),
}


@pytest.mark.parametrize("whose", sorted(SPOOFED))
@pytest.mark.parametrize("how", ["compile", "code.replace"])
def test_code_that_claims_another_file_cannot_start_a_thread_or_pass_for_theirs(whose, how):
    """A reader of allowed.py knows that a call is the rank's when its frame's file is not ours, torch's or Python's:
    code compiled (or a code object replaced) under such a name is refused where it is made, before it can start
    a thread that the check would take for torch's."""
    source = "import threading\nthreading.Thread(target=lambda: None).start()\n"
    name = SPOOFED[whose]()

    def fn(dist):
        if dist.get_rank() == 1:
            if how == "compile":
                exec(compile(source, name, "exec"))
            else:
                exec(compile(source, "mine.py", "exec").replace(co_filename=name))
        dist.barrier()

    with pytest.raises(sim.RankThreadError) as info:
        sim.run(fn, 2)
    text = str(info.value)
    assert f"rank 1 made code under the file name {name!r}" in text and "test_sim_threads.py:" in text, text
    assert rank_threads() == []


def test_code_a_rank_compiles_under_its_own_names_runs():
    """exec of a string, a compile under a name of the learner's, dataclasses' generated methods: all allowed."""
    import dataclasses

    def fn(dist):
        space = {}
        exec(compile("def double(t):\n    return t * 2\n", "my_helpers.py", "exec"), space)
        exec("y = 3", space)
        Point = dataclasses.make_dataclass("Point", ["x", "y"])
        return float(space["double"](torch.ones(2)).sum()) + space["y"] + Point(1, 2).y

    assert sim.run(fn, 2).results == [9.0, 9.0]


def test_torch_s_own_intra_op_threads_and_threads_outside_the_run_stay():
    """torch's intra-op threads run the rank's own ops (which the mode sees): a rank may ask for them; and the
    rules hold only while a rank's own code runs."""
    def fn(dist):
        torch.set_num_threads(2)
        a = torch.ones(256, 256, dtype=torch.float64)
        return (a @ a).sum()

    result = sim.run(fn, 2)
    assert [float(r) for r in result.results] == [256.0 ** 3] * 2
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()


def test_dist_kept_after_its_run_is_a_clear_error():
    kept = []

    def fn(dist):
        kept.append(dist)
        kept.append(dist.all_reduce(torch.ones(1), async_op=True))
        kept[-1].wait()

    sim.run(fn, 1)
    for use in (lambda: kept[0].all_reduce(torch.ones(1)), lambda: kept[0].send(torch.ones(1), 0),
                lambda: kept[1].wait(), lambda: kept[1].is_completed()):
        with pytest.raises(sim.RankThreadError) as info:
            use()
        assert "after its run had ended" in str(info.value)


@pytest.mark.parametrize("first_run", ["returned", "failed"])
def test_dist_kept_from_an_earlier_run_and_used_in_a_later_one_says_so(first_run):
    """A later run's thread may get the same thread id as the earlier run's rank: the kept dist must still say that
    its run has ended (it once raised the runtime's internal stop, with no message, or blamed another rank)."""
    kept = {}

    def first(dist):
        kept[dist.get_rank()] = dist
        if first_run == "failed" and dist.get_rank() == 1:
            raise ValueError("rank 1 fails")
        dist.barrier()

    def later(dist):
        kept[dist.get_rank()].all_reduce(torch.ones(2))

    try:
        sim.run(first, 2)
    except ValueError:
        pass
    with pytest.raises(sim.RankThreadError) as info:
        sim.run(later, 2)
    assert "dist (or one of its work handles) after its run had ended" in str(info.value), str(info.value)


def test_the_runtimes_stop_says_what_happened_to_a_rank_that_catches_it():
    said = []

    def fn(dist):
        if dist.get_rank() == 1:
            raise ValueError("rank 1 fails")
        try:
            dist.barrier()  # waits for rank 1: the stop comes here
        except BaseException as exc:  # noqa: BLE001  (what a learner's code may do)
            said.append(str(exc))
            raise

    with pytest.raises(ValueError):
        sim.run(fn, 2)
    assert said and "the simulator stopped this rank" in said[0], said


def test_a_thread_that_will_not_stop_is_abandoned_and_a_command_line_run_still_ends(tmp_path):
    """A rank that catches every exception around an endless loop gets its time limit, but Python cannot kill a
    thread: the error says the thread is abandoned, and the command still ends (in a process of its own here, so
    that no spinning thread is left in the test process)."""
    import subprocess
    import sys

    from grader.frontends.targets import REPO

    (tmp_path / "p3_data_parallel.py").write_text(
        "def data_parallel_step(dist, x_shard, target_shard, layers, lr):\n"
        "    while True:\n        try:\n            while True:\n                pass\n"
        "        except BaseException:\n            continue\n")
    proc = subprocess.run([sys.executable, "-m", "grader", "check", str(tmp_path), "-p", "p3", "--timeout", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "TimeLimitError" in proc.stdout and "It is abandoned: it keeps running in this process" in proc.stdout


def test_one_rank_using_anothers_dist_is_refused():
    box = []

    def fn(dist):
        if dist.get_rank() == 0:
            box.append(dist)
        dist.barrier()
        if dist.get_rank() == 1:
            box[0].barrier()  # borrowed

    with pytest.raises(sim.RankThreadError) as info:
        sim.run(fn, 2)
    assert "rank 1 called barrier" in str(info.value) and "through the dist of rank 0" in str(info.value)


def test_every_call_after_the_stop_raises_in_the_rank_s_thread():
    """A rank that catches the stop gets it again at its next op: it never runs on after the run has failed."""
    after = []

    def fn(dist):
        if dist.get_rank() == 1:
            raise ValueError("rank 1 fails")
        try:
            dist.barrier()  # waits for rank 1: the stop comes here
        except BaseException:
            pass
        x = torch.ones(2) + 1  # raises again
        after.append(x)

    with pytest.raises(ValueError):
        sim.run(fn, 2)
    assert after == [] and rank_threads() == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # a stop can land in a finalizer
def test_an_endless_loop_that_catches_every_exception_is_stopped():
    def fn(dist):
        x = torch.zeros(1)
        if dist.get_rank() == 1:
            while True:
                try:
                    x = x + 1  # stubborn
                except BaseException:
                    pass
        dist.barrier()

    start = time.monotonic()
    with pytest.raises(sim.TimeLimitError) as info:
        sim.run(fn, 2, timeout=0.3)
    assert site("stubborn") in str(info.value)
    for t in [t for t in threading.enumerate() if t.name.startswith("sim-rank")]:
        t.join(timeout=10)
    assert rank_threads() == [], f"still spinning {time.monotonic() - start:.1f} s after the start"


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="a process that may use one CPU only (or a system without thread affinity)")
def test_the_ranks_of_a_run_keep_to_one_cpu_and_the_process_keeps_its_own():
    """One rank runs at a time, so the ranks' threads share the CPU the run started on: handing the baton across
    CPUs was most of a collective's cost (world._RankThread). The caller's own thread is left as it was."""
    before = os.sched_getaffinity(0)

    def fn(dist):
        return sorted(os.sched_getaffinity(0))

    cpus = sim.run(fn, 4).results
    assert all(len(c) == 1 for c in cpus) and len({tuple(c) for c in cpus}) == 1, cpus
    assert cpus[0][0] in before
    assert os.sched_getaffinity(0) == before
