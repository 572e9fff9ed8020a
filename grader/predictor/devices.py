"""Real GPUs as device profiles, for predicting a training step at a published size (`python -m grader predict`).

The puzzles never use these: every puzzle runs on PUZZLE_GPU (cost.py). A tick is a nanosecond here too, so a
rate in FLOPs per tick is TFLOP/s times 1,000 and a bandwidth in bytes per tick is GB/s.

Where each constant comes from (peak rates and bandwidths: NVIDIA's datasheets; the efficiency curves:
Calculon's system files, github.com/calculon-ai/calculon, systems/a100_80g.json and h100_80g_nvl8.json, Apache-2.0,
which are that project's assumptions, not measurements of ours; nothing here is fitted to the runs we validate
against, bench/SCALE.md):

    A100 SXM 80GB   19.5 TFLOP/s float32, 312 dense float16/bfloat16 on tensor cores (x16), 78 float16 on the
                    vector units (x4; Calculon's "vector" rate); HBM2e 2,039 GB/s
    H100 SXM        67 TFLOP/s float32, 989 dense bfloat16 on tensor cores; 120 float16 on the vector units
                    (Calculon); HBM3 3,350 GB/s. The H100s of Meta's Grand Teton hosts, where torchtitan measured
                    its published throughput, carry 96 GB of HBM2e at 2,400 GB/s and run at 500 W (a 700 W part's
                    peak is kept: no public figure says what 500 W costs)

    efficiency (Calculon, the same for both):
      matrix  by the GFLOPs of one product op:   >= 128: 0.95   >= 16: 0.9   >= 1: 0.6    else 0.1
      vector  by the GFLOPs of one other op:     >= 16: 0.95    >= 1: 0.5    else 0.1
      memory  by the MB an op reads and writes:  >= 100: 0.9    >= 10: 0.75  >= 1: 0.6    else 0.3

One constant is fitted (the issue's rule: on one configuration, the error reported on the others): the fraction
of Calculon's matrix efficiency that the A100s of Korthikanti et al.'s runs reach, 0.774, found by bisection so
that the 22B model with sequence parallelism and selective recomputation takes its published 1.10 s
(bench/bench_scale.py --fit). Large products then run at 0.774 · 0.95 = 73.5% of the tensor cores' peak, 229
TFLOP/s. A100_80GB is the fitted profile, the one predictions use; A100_80GB_CALCULON has Calculon's curves as
published. Nothing else is fitted, and the H100 profiles keep Calculon's curves.

Kernel launches cost nothing: on a GPU the host queues kernels ahead of the device, which runs them back to back
(Calculon assumes the same). What a kernel costs at a size between two steps is a step function's guess; a real
GEMM's efficiency also depends on its shape, tiling and the cuBLAS version, which none of this models.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

from puzzles.simulator.cost import DeviceProfile, Efficiency

# Calculon's curves (systems/a100_80g.json, h100_80g_nvl8.json): (threshold, fraction of peak), largest first.
MATRIX_EFFICIENCY = ((128, "0.95"), (16, "0.9"), (1, "0.6"), (0, "0.1"))  # GFLOPs of one product
VECTOR_EFFICIENCY = ((16, "0.95"), (1, "0.5"), (0, "0.1"))  # GFLOPs of one other op
MEMORY_EFFICIENCY = ((100, "0.9"), (10, "0.75"), (1, "0.6"), (0, "0.3"))  # MB read and written by one op

A100_80GB_CALCULON = DeviceProfile(
    "A100 SXM 80GB (Calculon's curves)", flops_per_tick=19_500, memory_bytes_per_tick=2_039, launch_ticks=0,
    half_precision_speedup=16,  # 312 / 19.5 TFLOP/s: tensor cores
    efficiency=Efficiency(MATRIX_EFFICIENCY, VECTOR_EFFICIENCY, MEMORY_EFFICIENCY,
                          vector_half_speedup=4))  # 78 / 19.5 TFLOP/s

# The one fitted constant (module docstring): the share of Calculon's matrix efficiency the A100s reach.
A100_MATRIX_FRACTION = Fraction("0.774")
A100_80GB = dataclasses.replace(A100_80GB_CALCULON, name="A100 SXM 80GB",
                                efficiency=A100_80GB_CALCULON.efficiency.scaled(A100_MATRIX_FRACTION))

H100_SXM = DeviceProfile(
    "H100 SXM 80GB", flops_per_tick=67_000, memory_bytes_per_tick=3_350, launch_ticks=0,
    half_precision_speedup=Fraction(989, 67),
    efficiency=Efficiency(MATRIX_EFFICIENCY, VECTOR_EFFICIENCY, MEMORY_EFFICIENCY,
                          vector_half_speedup=Fraction(120, 67)))

H100_GRAND_TETON = DeviceProfile(
    "H100 SXM 96GB HBM2e (Grand Teton, 500 W)", flops_per_tick=67_000, memory_bytes_per_tick=2_400,
    launch_ticks=0, half_precision_speedup=Fraction(989, 67),
    efficiency=Efficiency(MATRIX_EFFICIENCY, VECTOR_EFFICIENCY, MEMORY_EFFICIENCY,
                          vector_half_speedup=Fraction(120, 67)))
