"""How fast is the simulated runtime (puzzles/sim.py)? Measured against real gloo processes and plain torch.

    python bench/bench_sim.py            # the full run (1-3 minutes on 2 cores, depending on other load)
    python bench/bench_sim.py --quick    # a short run (20-40 s; gloo with 4 processes only)

What it measures, all in one run, so that every ratio compares numbers taken within minutes on one machine:

1. all-reduce wall time per call, float64, world sizes 2..64 and buffers of 8 KiB .. 4 MiB, in the simulator and,
   for world sizes 2, 4 and 8, in torch.distributed's gloo backend on real processes (torch.multiprocessing spawn,
   CPU). Both run the *same* rank function (`allreduce_timings`), once with the simulator's `dist` and once with
   `torch.distributed`: the simulator's API promise, exercised. The processes' start-up time is reported apart.
2. the cost of the memory ledger and the clock: an MLP forward/backward (the puzzles' sizes) in plain torch in
   the main thread against the same code inside `sim.run(fn, 1)`.
3. a 64-rank run in which every rank makes 10 all-reduces of 64 KiB: total wall time of `sim.run`.

Timings are medians of several repeats after warm-up. The targets are printed next to the measurements; nothing is
asserted (a benchmark that fails on a noisy machine teaches nothing). Results are recorded in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import queue as queue_module
import socket
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

try:
    from puzzles import sim
except ImportError:  # run from a checkout that was not pip-installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from puzzles import sim

KIB = 1024
F64 = 8  # bytes per float64
SIZES = [8 * KIB, 64 * KIB, 512 * KIB, 1024 * KIB, 4096 * KIB]  # bytes; 1 MiB is the target row's size
SIM_WORLDS = [2, 4, 8, 16, 32, 64]
GLOO_WORLDS = [2, 4, 8]  # 64 processes on 2 cores would take all day

# Issue 31: the simulator's own cost, which every test pays. (Before the roofline clock and the guards, this bench
# measured 0.32-0.34 ms for the all-reduce; the memcpy floor of its copies and adds is about 0.12 ms.)
TARGET_ALLREDUCE_MS = 0.35  # 4 ranks, 1 MiB float64, in the simulator
TARGET_64_RANKS_S = 5.0  # 64 ranks x 10 all-reduces of 64 KiB
TARGET_LEDGER_RATIO = 1.5  # MLP forward/backward under sim.run(fn, 1) over plain torch

CHECK_WORLD, CHECK_NUMEL = 4, 64 * KIB // F64  # the value check: 4 ranks, 64 KiB


def fmt_size(nbytes: int) -> str:
    return f"{nbytes // (1024 * KIB)} MiB" if nbytes >= 1024 * KIB else f"{nbytes // KIB} KiB"


# --------------------------------------------------------------------------------------------------------------
# The rank functions. Each takes `dist` first: the simulator's handle or the torch.distributed module itself.


def allreduce_timings(dist, cases, warmup: int, repeats: int) -> dict:
    """For each (numel, calls) case: `repeats` times, the wall seconds per all-reduce over `calls` back-to-back
    all-reduces of a float64 buffer, as rank 0 sees them.

    In the simulator one rank runs at a time, so rank 0's stopwatch spans every rank's share of each collective.
    The barrier after each timed loop makes the last rank stop at once (cheaply) after its last all-reduce, so
    rank 0's stopwatch does not run on into another rank's set-up work."""
    out = {}
    for numel, calls in cases:
        x = torch.rand(numel, dtype=torch.float64)  # SUM multiplies it by N each call: callers keep calls bounded
        for _ in range(warmup):
            dist.all_reduce(x)
        per_call = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(x)
            per_call.append((time.perf_counter() - t0) / calls)
        dist.barrier()
        if not torch.isfinite(x).all():
            raise RuntimeError(f"all-reduce buffer overflowed ({numel} elements, {calls} calls): fewer calls")
        out[numel] = per_call
    return out


def seeded_allreduce(dist, numel: int) -> torch.Tensor:
    """One all-reduce of a seeded random buffer: the same bits on the simulator and on gloo, if both are right."""
    rank = dist.get_rank()
    x = torch.randn(numel, dtype=torch.float64, generator=torch.Generator().manual_seed(1000 + rank))
    dist.all_reduce(x)
    return x


def ten_allreduces(dist, numel: int) -> None:
    x = torch.rand(numel, dtype=torch.float64)
    for _ in range(10):
        dist.all_reduce(x)


def mlp_params(layers: int, d: int, h: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(d, h, dtype=torch.float64, generator=g).div_(math.sqrt(d)).requires_grad_(),
             torch.randn(h, d, dtype=torch.float64, generator=g).div_(math.sqrt(h)).requires_grad_())
            for _ in range(layers)]


def mlp_step(params, x) -> None:
    """One forward/backward of L blocks y = x + gelu(x @ w1) @ w2, as the puzzles' model computes it."""
    for w1, w2 in params:
        x = x + F.gelu(x @ w1) @ w2
    loss = x.square().mean()
    loss.backward()
    for w1, w2 in params:
        w1.grad = w2.grad = None


def mlp_timings(dist, params, x, warmup: int, repeats: int, steps: int) -> list[float]:
    """Seconds per forward/backward step, `repeats` times over `steps` steps. `dist` is unused (None when plain)."""
    for _ in range(warmup):
        mlp_step(params, x)
    per_step = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            mlp_step(params, x)
        per_step.append((time.perf_counter() - t0) / steps)
    return per_step


# --------------------------------------------------------------------------------------------------------------
# Real processes: torch.multiprocessing spawn, gloo on 127.0.0.1.


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_worker(rank: int, world_size: int, port: int, jobs: dict, results) -> None:
    """One real rank. Reports ('entered', time) once Python and torch are up, ('ready', time) once the process
    group is formed, then ('done', results) or ('error', traceback)."""
    dist = torch.distributed
    try:
        results.put((rank, "entered", time.time()))
        torch.set_num_threads(1)  # 8 processes on 2 cores: intra-op threads would only fight
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=120))
        dist.barrier()
        results.put((rank, "ready", time.time()))
        out = {}
        if "timings" in jobs:
            out["timings"] = allreduce_timings(dist, *jobs["timings"])
        if "check" in jobs:
            x = seeded_allreduce(dist, jobs["check"])
            out["check"] = x.numpy().tobytes() if rank == 0 else None
        results.put((rank, "done", out if rank == 0 else None))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_gloo(world_size: int, jobs: dict, timeout: float, worker=_gloo_worker) -> dict:
    """Spawn `world_size` gloo processes, run `jobs`, return rank 0's results with the start-up times.
    Every process is gone when this returns, whatever happened (terminate, then kill)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    t_spawn = time.time()
    procs = mp.spawn(worker, args=(world_size, port, jobs, results), nprocs=world_size,
                     join=False, daemon=True)
    deadline = time.monotonic() + timeout
    entered, ready, done = {}, {}, {}
    finished = False
    try:
        while len(done) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"gloo with {world_size} processes: no result after {timeout:g} s "
                                   f"(ready: {sorted(ready)}, done: {sorted(done)})")
            try:
                rank, what, value = results.get(timeout=min(1.0, left))
            except queue_module.Empty:
                dead = [p.pid for p in procs.processes if not p.is_alive() and p.exitcode not in (0, None)]
                if dead:
                    raise RuntimeError(f"gloo with {world_size} processes: process(es) {dead} died") from None
                continue
            if what == "error":
                raise RuntimeError(f"gloo rank {rank} of {world_size} failed:\n{value}")
            {"entered": entered, "ready": ready, "done": done}[what][rank] = value
        finished = True
    finally:
        # On success the processes are exiting: give them a few seconds. On failure, stop them at once.
        grace = time.monotonic() + (10.0 if finished else 0.0)
        for p in procs.processes:
            p.join(timeout=max(0.0, grace - time.monotonic()))
        for stop in ("terminate", "kill"):
            alive = [p for p in procs.processes if p.is_alive()]
            for p in alive:
                getattr(p, stop)()
            for p in alive:
                p.join(timeout=5.0)
        results.close()
        results.join_thread()
    out = dict(done[0])
    out["startup_s"] = max(ready.values()) - t_spawn
    out["python_up_s"] = max(entered.values()) - t_spawn
    return out


# --------------------------------------------------------------------------------------------------------------
# The measurements.


class Settings:
    def __init__(self, quick: bool):
        self.quick = quick
        self.warmup = 2 if quick else 3
        self.repeats = 3 if quick else 7  # gloo: timed repeats per process group
        self.sim_passes, self.sim_repeats = (2, 2) if quick else (3, 3)  # the simulator: passes x repeats each
        # back-to-back calls per timed repeat, by buffer size (fewer for big buffers; the SUM grows N-fold per call,
        # so the total number of calls must keep N**calls below float64's range: see allreduce_cases)
        self.calls = {8 * KIB: 20, 64 * KIB: 20, 512 * KIB: 8, 1024 * KIB: 8, 4096 * KIB: 4}
        if quick:
            self.calls = {k: max(2, v // 4) for k, v in self.calls.items()}
        # Starting the processes dominates the gloo part (4 processes: 5-25 s here, 8: 15-50 s): --quick starts
        # only the 4 of the target row and the value check.
        self.gloo_worlds = [CHECK_WORLD] if quick else GLOO_WORLDS
        # rounds of (plain, sim); each side is the best of `repeats` timings of `steps` steps after warm-up
        self.mlp = dict(rounds=3 if quick else 7, warmup=2, repeats=3, steps=3 if quick else 5)
        self.big_runs = 2 if quick else 5

    def allreduce_cases(self, world_size: int):
        cases = []
        for nbytes in SIZES:
            calls = self.calls[nbytes]
            total = self.warmup + max(self.repeats, self.sim_repeats) * calls
            assert total * math.log2(world_size) < 1000, "the SUM would overflow float64"
            cases.append((nbytes // F64, calls))
        return cases


def bench_allreduce(s: Settings) -> tuple[dict, dict, dict, bytes | None]:
    """The simulator's passes alternate with the gloo runs (sim, gloo 2, sim, gloo 4, sim, gloo 8), so that both
    sample the same stretch of a shared machine's load; the simulator's repeats are pooled over its passes.

    Returns ({(world, nbytes): (median, min) ms per call} for the simulator, the same for gloo,
    {world: (python up s, group ready s)}, rank 0's result of the value check on gloo)."""
    sim_samples: dict = {}
    gloo, startup, check = {}, {}, None
    gloo_worlds = list(s.gloo_worlds)
    for i in range(max(s.sim_passes, len(gloo_worlds))):
        if i < s.sim_passes:
            for n in SIM_WORLDS:
                res = sim.run(allreduce_timings, n, args=(s.allreduce_cases(n), s.warmup, s.sim_repeats),
                              timeout=600)
                for numel, per_call in res.results[0].items():
                    sim_samples.setdefault((n, numel * F64), []).extend(per_call)
        if i < len(gloo_worlds):
            n = gloo_worlds[i]
            jobs = {"timings": (s.allreduce_cases(n), s.warmup, s.repeats)}
            if n == CHECK_WORLD:
                jobs["check"] = CHECK_NUMEL
            res = run_gloo(n, jobs, timeout=300)  # the processes are gone when it returns
            for numel, per_call in res["timings"].items():
                gloo[(n, numel * F64)] = (statistics.median(per_call) * 1e3, min(per_call) * 1e3)
            startup[n] = (res["python_up_s"], res["startup_s"])
            check = res.get("check", check)
    simulated = {k: (statistics.median(v) * 1e3, min(v) * 1e3) for k, v in sim_samples.items()}
    return simulated, gloo, startup, check


def bench_mlp(s: Settings) -> dict:
    """Plain torch and sim.run(fn, 1) in alternating rounds, so both sides of each round's ratio see the same
    machine (other work on a shared machine comes and goes within seconds); report the median of the ratios."""
    layers, d, h, batch = 8, 64, 256, 32
    params = mlp_params(layers, d, h)
    x = torch.randn(batch, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    m = s.mlp
    plain, in_sim, ratios, whole = [], [], [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as inside sim.run, whose ranks run with one intra-op thread
    try:
        for _ in range(m["rounds"]):
            p = min(mlp_timings(None, params, x, m["warmup"], m["repeats"], m["steps"]))
            t0 = time.perf_counter()
            res = sim.run(mlp_timings, 1, args=(params, x, m["warmup"], m["repeats"], m["steps"]), timeout=600)
            whole.append(time.perf_counter() - t0)
            q = min(res.results[0])
            plain.append(p)
            in_sim.append(q)
            ratios.append(q / p)
    finally:
        torch.set_num_threads(threads)
    with _OpCounter() as counter:  # aten ops per step, to express the overhead per op
        mlp_step(params, x)
    return dict(plain_ms=statistics.median(plain) * 1e3, sim_ms=statistics.median(in_sim) * 1e3,
                ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios), rounds=m["rounds"],
                sim_run_s=statistics.median(whole), aten_ops=counter.ops, peak_bytes=res.peak_bytes[0])


class _OpCounter(TorchDispatchMode):
    """Counts the aten ops that reach the dispatcher: what the simulator's dispatch mode sees, one call each."""

    ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def bench_64_ranks(s: Settings) -> dict:
    numel = 64 * KIB // F64
    walls = []
    for _ in range(s.big_runs):
        t0 = time.perf_counter()
        sim.run(ten_allreduces, 64, args=(numel,), timeout=600)
        walls.append(time.perf_counter() - t0)
    return dict(median_s=statistics.median(walls), min_s=min(walls), max_s=max(walls), runs=len(walls))


def value_check(gloo_bytes: bytes | None) -> dict:
    res = sim.run(seeded_allreduce, CHECK_WORLD, args=(CHECK_NUMEL,))
    simulated = res.results[0]
    same_on_all_ranks = all(torch.equal(simulated, r) for r in res.results)
    serial = sum(torch.randn(CHECK_NUMEL, dtype=torch.float64, generator=torch.Generator().manual_seed(1000 + r))
                 for r in range(CHECK_WORLD))
    out = dict(same_on_all_ranks=same_on_all_ranks, serial_max_abs=(simulated - serial).abs().max().item())
    if gloo_bytes is not None:
        gloo = torch.frombuffer(bytearray(gloo_bytes), dtype=torch.float64)
        diff = (simulated - gloo).abs()
        out.update(gloo_max_abs=diff.max().item(), gloo_bitwise=torch.equal(simulated, gloo),
                   gloo_close=torch.allclose(simulated, gloo, rtol=1e-12, atol=1e-12),
                   gloo_differing=int((diff > 0).sum()))
    return out


# --------------------------------------------------------------------------------------------------------------
# Reporting.


def machine() -> str:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return (f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs ({cpu}); Python "
            f"{platform.python_version()}, torch {torch.__version__}")


def load_average() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def verdict(measured: float, target: float) -> str:
    return "meets" if measured <= target else "MISSES"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="fewer repeats and calls, gloo with 4 processes only (about 20-40 s)")
    ap.add_argument("--no-gloo", action="store_true", help="skip the real gloo processes")
    ap.add_argument("--json", metavar="PATH", help="also write the measurements to PATH as JSON")
    a = ap.parse_args(argv)
    s = Settings(a.quick)
    if a.no_gloo:
        s.gloo_worlds = []

    started, load0 = time.perf_counter(), load_average()
    print(f"# bench_sim.py{' --quick' if a.quick else ''}  {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}")
    print(f"# {machine()}")
    print(f"# all-reduce: warm-up {s.warmup} calls; timed repeats: gloo {s.repeats}, simulator {s.sim_passes} "
          f"passes x {s.sim_repeats}; calls per repeat by size: "
          + ", ".join(f"{fmt_size(k)} {v}" for k, v in s.calls.items()))
    sys.stdout.flush()

    # Gloo first: its processes are gone before the simulator runs, so they steal no cores from it.
    simulated, gloo, startup, gloo_check = bench_allreduce(s)
    mlp = bench_mlp(s)
    big = bench_64_ranks(s)
    check = value_check(gloo_check)

    print(f"\n## 1. all-reduce, float64, wall ms per call: median (and min) of the repeats; gloo/sim of the medians")
    print(f"{'ranks':>5}  {'size':>7}  {'sim ms':>9} {'(min)':>9}  {'gloo ms':>9} {'(min)':>9}  {'gloo/sim':>8}")
    for n in SIM_WORLDS:
        for nbytes in SIZES:
            (sm, smin), gl = simulated[(n, nbytes)], gloo.get((n, nbytes))
            g = f"{gl[0]:9.3f} {f'({gl[1]:.3f})':>9}  {gl[0] / sm:8.1f}" if gl else f"{'-':>9} {'':>9}  {'-':>8}"
            print(f"{n:>5}  {fmt_size(nbytes):>7}  {sm:9.3f} {f'({smin:.3f})':>9}  {g}")
    if startup:
        print("\ngloo process start-up (spawn until every process is up / has formed the group and passed a barrier):")
        for n, (up, ready) in startup.items():
            print(f"  {n} processes: Python+torch up {up:.2f} s, group ready {ready:.2f} s")

    print("\n## 2. memory ledger + clock overhead: MLP forward/backward, L=8, d=64, h=256, batch 32, float64")
    print(f"  {mlp['rounds']} alternating rounds of plain torch then sim.run(fn, 1); each side the best of "
          f"{s.mlp['repeats']} timings of {s.mlp['steps']} steps; medians over the rounds")
    print(f"  plain torch, main thread, 1 intra-op thread: {mlp['plain_ms']:8.3f} ms/step")
    print(f"  inside sim.run(fn, 1)                      : {mlp['sim_ms']:8.3f} ms/step  "
          f"(one whole sim.run incl. set-up: {mlp['sim_run_s']:.2f} s)")
    per_op_us = (mlp['sim_ms'] - mlp['plain_ms']) * 1e3 / mlp['aten_ops']
    print(f"  ratio sim/plain: {mlp['ratio']:.2f}x (rounds ranged {mlp['ratio_min']:.2f}x .. {mlp['ratio_max']:.2f}x); "
          f"{mlp['aten_ops']} aten ops per step, about {per_op_us:.1f} us extra each")

    print("\n## 3. 64 ranks x 10 all-reduces of 64 KiB: total wall time of sim.run (set-up and teardown included)")
    print(f"  median {big['median_s']:.3f} s over {big['runs']} runs (min {big['min_s']:.3f}, max {big['max_s']:.3f})")

    print(f"\n## value check: all-reduce (SUM) of seeded randn, {CHECK_WORLD} ranks, {fmt_size(CHECK_NUMEL * F64)}")
    print(f"  simulator: same result on every rank: {check['same_on_all_ranks']}; "
          f"max |sim - serial sum in rank order| = {check['serial_max_abs']:.3g}")
    if "gloo_max_abs" in check:
        print(f"  simulator vs gloo: max |diff| = {check['gloo_max_abs']:.3g}, allclose(rtol=atol=1e-12): "
              f"{check['gloo_close']}, bitwise equal: {check['gloo_bitwise']} "
              f"({check['gloo_differing']} of {CHECK_NUMEL} elements differ in the last bits: gloo's ring adds in "
              f"another order)" if not check['gloo_bitwise'] else
              f"  simulator vs gloo: bitwise equal ({CHECK_NUMEL} elements)")

    ar, ar_min = simulated[(4, 1024 * KIB)]
    print("\n## targets (reported, not asserted)")
    print(f"  {'target':<52} {'goal':>9} {'measured':>10}")
    print(f"  {'sim all-reduce, 4 ranks, 1 MiB float64':<52} {f'<= {TARGET_ALLREDUCE_MS:g} ms':>9} {ar:8.3f} ms  "
          f"{verdict(ar, TARGET_ALLREDUCE_MS)} "
          f"(min of the repeats {ar_min:.3f} ms)")
    print(f"  {'sim 64 ranks x 10 all-reduces of 64 KiB':<52} {f'<= {TARGET_64_RANKS_S:g} s':>9} "
          f"{big['median_s']:8.3f} s   "
          f"{verdict(big['median_s'], TARGET_64_RANKS_S)}")
    print(f"  {'ledger+clock over plain torch (MLP fwd/bwd)':<52} {f'<= {TARGET_LEDGER_RATIO:g}x':>9} "
          f"{mlp['ratio']:8.2f} x   "
          f"{verdict(mlp['ratio'], TARGET_LEDGER_RATIO)}")
    if (4, 1024 * KIB) in gloo:
        gl = gloo[(4, 1024 * KIB)][0]
        print(f"  (gloo, 4 processes, 1 MiB: {gl:.3f} ms, {gl / ar:.1f}x the simulator's time, same run)")
    print(f"\ntotal bench time: {time.perf_counter() - started:.1f} s; load average at start {load0}, at end "
          f"{load_average()} (other work on the machine inflates every number)")

    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({
            "quick": a.quick, "machine": machine(), "date": datetime.datetime.now().astimezone().isoformat(),
            "sim_ms_median_min": {f"{n}x{b}": v for (n, b), v in simulated.items()},
            "gloo_ms_median_min": {f"{n}x{b}": v for (n, b), v in gloo.items()},
            "gloo_startup_s": {str(n): {"python_up": u, "group_ready": r} for n, (u, r) in startup.items()},
            "mlp": mlp, "ranks64": big, "check": check}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
