"""The roofline clock against a real machine: for ops of every class, the ticks the clock charges (the puzzles' GPU)
against the wall time the same op takes on this CPU, so that what the clock gets right (the proportions between
ops) and what it does not is on record.

    PYTHONPATH=$PWD python bench/bench_calibration.py [--write]     # prints the table; --write: bench/CALIBRATION.md

The clock models a GPU, not this CPU, so absolute times differ by design: the question is whether their ratios
agree. One scale (ns of CPU per tick) is fitted on the matmuls alone, the ops the clock calls compute-bound; every
other row shows how far the clock's prediction, at that scale, is from the measurement. torch runs on one thread.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from puzzles import sim
from puzzles.model import causal_attention, init_transformer, rms_norm

F64 = torch.float64


def cases():
    """(class, name, setup -> fn): each fn runs one op (or one small known group of ops) on fresh-made inputs."""
    def mm(m, k, n):
        a, b = torch.randn(m, k, dtype=F64), torch.randn(k, n, dtype=F64)
        return lambda: a @ b

    def unary(op, *shape):
        x = torch.randn(*shape, dtype=F64)
        return lambda: op(x)

    def binary(op, *shape):
        x, y = torch.randn(*shape, dtype=F64), torch.randn(*shape, dtype=F64)
        return lambda: op(x, y)

    def attention(s, d=64, heads=4):
        x = torch.randn(1, s, d, dtype=F64)
        (w,) = init_transformer(1, d, 4 * d, 0, requires_grad=False)
        return lambda: causal_attention(x, w.wqkv, w.wo, heads)

    yield "matmul", "mm 8x64 @ 64x256", lambda: mm(8, 64, 256)
    yield "matmul", "mm 64x64 @ 64x256", lambda: mm(64, 64, 256)
    yield "matmul", "mm 256x256 @ 256x256", lambda: mm(256, 256, 256)
    yield "matmul", "mm 512x512 @ 512x512", lambda: mm(512, 512, 512)
    yield "elementwise", "gelu [8, 256]", lambda: unary(F.gelu, 8, 256)
    yield "elementwise", "gelu [256, 1024]", lambda: unary(F.gelu, 256, 1024)
    yield "elementwise", "add [64, 256]", lambda: binary(torch.add, 64, 256)
    yield "elementwise", "add [1024, 1024]", lambda: binary(torch.add, 1024, 1024)
    yield "elementwise", "mul [1024, 1024]", lambda: binary(torch.mul, 1024, 1024)
    yield "reduction", "sum [1024, 1024]", lambda: unary(torch.sum, 1024, 1024)
    yield "reduction", "mean over rows [1024, 1024]", lambda: unary(lambda x: x.mean(dim=1), 1024, 1024)
    yield "softmax/norm", "softmax [256, 1024]", lambda: unary(lambda x: torch.softmax(x, dim=-1), 256, 1024)
    yield "softmax/norm", "layer_norm [256, 1024]", lambda: unary(lambda x: F.layer_norm(x, (1024,)), 256, 1024)
    yield "softmax/norm", "rms_norm (written out) [256, 1024]", lambda: binary(
        lambda x, w: rms_norm(x, w[0]), 256, 1024)
    yield "memory", "clone [1024, 1024]", lambda: unary(torch.clone, 1024, 1024)
    yield "memory", "cat 2 x [512, 1024]", lambda: binary(lambda x, y: torch.cat([x, y]), 512, 1024)
    yield "attention", "causal attention s=128, d=64 (written out)", lambda: attention(128)
    yield "attention", "causal attention s=512, d=64 (written out)", lambda: attention(512)


def wall_ns(fn, repeats: int) -> float:
    """The median of `repeats` timings of fn (each after a warm-up run), in nanoseconds."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times)


def measure(repeats: int):
    rows = []
    for kind, name, setup in cases():
        fn = setup()
        with sim.tally() as t:
            fn()
        rows.append({"class": kind, "name": name, "ticks": t.ticks, "flops": t.flops, "bytes": t.bytes,
                     "ops": t.ops, "wall_ns": wall_ns(fn, repeats)})
    matmuls = [r for r in rows if r["class"] == "matmul"]
    # ns of this CPU per tick, fitted on the compute-bound matmuls (geometric mean of their ratios)
    scale = math.exp(sum(math.log(r["wall_ns"] / r["ticks"]) for r in matmuls) / len(matmuls))
    for r in rows:
        r["predicted_ns"] = r["ticks"] * scale
        r["off"] = r["wall_ns"] / r["predicted_ns"]
    return rows, scale


def table(rows, scale) -> str:
    lines = ["| class | op | clock: ticks (FLOPs, bytes, ops) | this CPU: wall time | measured / predicted |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['class']} | {r['name']} | {r['ticks']:,} ({r['flops']:,}, {r['bytes']:,}, {r['ops']}) | "
                     f"{r['wall_ns'] / 1000:,.1f} µs | {r['off']:.2f}x |")
    by_class = {}
    for r in rows:
        by_class.setdefault(r["class"], []).append(r["off"])
    lines += ["", f"Scale fitted on the matmuls: {scale:,.2f} ns of this CPU per tick.", "",
              "| class | measured / predicted, geometric mean (range) |", "| --- | --- |"]
    for kind, offs in by_class.items():
        mean = math.exp(sum(math.log(o) for o in offs) / len(offs))
        lines.append(f"| {kind} | {mean:.2f}x ({min(offs):.2f}x to {max(offs):.2f}x) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--write", action="store_true", help="write bench/CALIBRATION.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows, scale = measure(args.repeats)
    text = table(rows, scale)
    print(text)
    if args.write:
        head = (Path(__file__).with_name("CALIBRATION.md").read_text().split("<!-- table -->")[0]
                if Path(__file__).with_name("CALIBRATION.md").exists() else "")
        machine = (f"Measured with `PYTHONPATH=$PWD python bench/bench_calibration.py --write` on {platform.machine()}, "
                   f"Python {sys.version.split()[0]}, torch {torch.__version__}, one thread, median of "
                   f"{args.repeats} runs.\n\n")
        Path(__file__).with_name("CALIBRATION.md").write_text(head + "<!-- table -->\n" + machine + text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
