"""Real GPUs as device profiles, for predicting a training step at a published size (`python -m grader predict`).

The puzzles never use these: every puzzle runs on PUZZLE_GPU (cost.py). A tick is a nanosecond here too, so a
rate in FLOPs per tick is TFLOP/s times 1,000 and a bandwidth in bytes per tick is GB/s.

Where each constant comes from. Peak rates and bandwidths: NVIDIA's datasheets. The efficiency curves and the
processing mode: Calculon (github.com/calculon-ai/calculon, Apache-2.0) at caa4b11 (2024-02-22; its
systems/a100_80g.json and h100_80g_nvl8.json last changed in 71f6435, 2023-04-25), the files its own validation
against Korthikanti et al.'s Table 5 runs with. They are that project's assumptions, not measurements of ours.

Fitted: one constant per GPU, each on the fit set only (grader/predictor/published.py; bench/bench_scale.py
--fit), so that the mean signed error of its runs is zero: the share of those curves' matrix efficiency (and of
the attention kernel's) that the GPUs of the published runs reached.

    A100_FITTED  0.930   on Korthikanti et al.'s 8 runs (nothing fitted: 4.7% fast on average); large
                         products then run at 0.93 · 0.95 = 88% of the tensor cores' 312 TFLOP/s
    H100_FITTED  0.8311  on torchtitan's Llama 3.1 8B on 8 Grand Teton H100s (nothing fitted: 8.7% fast): an
                         effective 822 TFLOP/s at the curve's top, against the 835-989 that torchtitan's own
                         footnote gives for its 500 W part's unknown peak (NVL's to SXM's); the constant also
                         absorbs what the step leaves out there (eager mode's host work above all)

The held-out runs are predicted with these and never fitted on; bench/SCALE.md shows them with and without the
constants (`--cluster a100-unfitted`, `h100-grand-teton-unfitted`). The DGX H100 (`--cluster h100`), which no
published run here uses, keeps Calculon's curves as they are.

    A100 SXM 80GB   19.5 TFLOP/s float32, 312 dense float16/bfloat16 on tensor cores (x16), 78 float16 on the
                    vector units (x4; Calculon's "vector" rate); HBM2e 2,039 GB/s (Calculon: 2,048)
    H100 SXM        67 TFLOP/s float32, 989 dense bfloat16 on tensor cores (Calculon: 1,000); 120 float16 on the
                    vector units (Calculon); HBM3 3,350 GB/s (Calculon: 3,072). The H100s of Meta's Grand Teton
                    hosts, where torchtitan measured its published throughput, carry 96 GB of HBM2e at 2,400 GB/s
                    and run at 500 W (a 700 W part's peak is kept: no public figure says what 500 W costs)

    efficiency (Calculon, the same for both):
      matrix  by the GFLOPs of one product op:   >= 128: 0.95   >= 16: 0.9   >= 1: 0.6    else 0.1
      vector  by the GFLOPs of one other op:     >= 16: 0.95    >= 1: 0.5    else 0.1
      memory  by the MB an op reads and writes:  >= 100: 0.9    >= 10: 0.75  >= 1: 0.6    else 0.3

    attention on the H100 (the flash kernel torchtitan's Llama runs: PyTorch's scaled_dot_product_attention of
      late 2024 tries its flash backend, FlashAttention-2, first): FlashAttention-2 reaches "only 35%
      utilization on the H100 GPU" (Shah et al. 2024, FlashAttention-3, arXiv 2407.08608, abstract), counting a
      causal attention's FLOPs without its masked half; the simulator counts them with it (op_costs.py's
      _attention), so such an op runs at 0.70 of the peak on that count. Calculon has no flash kernel (its
      attention is two GEMMs on the matrix curve), and the GPT's attention here is two products, on the curve.

    processing mode (Calculon's "no_overlap", calculon/system.py get_processing_time): an op takes the time of
      its arithmetic plus the time of its memory traffic, each at its achieved fraction of peak; not the
      roofline's larger of the two. A GEMM then pays for reading its operands and writing its result on top of
      its FLOPs, as a kernel that does not hide all of its loads does. `PROCESSING_ROOFLINE` keeps the roofline
      (the simulator's own rule, cost.py) for comparison (--cluster a100-roofline).

Kernel launches cost nothing: on a GPU the host queues kernels ahead of the device, which runs them back to back
(Calculon assumes the same). What a kernel costs at a size between two steps is a step function's guess; a real
GEMM's efficiency also depends on its shape, tiling and the cuBLAS version, which none of this models.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction

import torch

from puzzles.simulator.cost import DeviceProfile, Efficiency
from puzzles.simulator.op_costs import PRODUCTS

# Calculon's curves (systems/a100_80g.json, h100_80g_nvl8.json): (threshold, fraction of peak), largest first.
MATRIX_EFFICIENCY = ((128, "0.95"), (16, "0.9"), (1, "0.6"), (0, "0.1"))  # GFLOPs of one product
VECTOR_EFFICIENCY = ((16, "0.95"), (1, "0.5"), (0, "0.1"))  # GFLOPs of one other op
MEMORY_EFFICIENCY = ((100, "0.9"), (10, "0.75"), (1, "0.6"), (0, "0.3"))  # MB read and written by one op

PROCESSING_SUM, PROCESSING_ROOFLINE = "no_overlap", "roofline"  # Calculon's names for the two modes


@dataclass(frozen=True)
class CalculonDevice(DeviceProfile):
    """A device profile whose ops take Calculon's processing time: arithmetic time plus memory time
    (`processing` "no_overlap"), or the larger of the two ("roofline", cost.py's own rule)."""

    processing: str = PROCESSING_SUM
    attention: Fraction | None = None  # the fraction of peak a flash-attention op reaches, when not the curve's

    def _achieved_ticks(self, cost, dtype) -> int:
        if self.processing == PROCESSING_ROOFLINE:
            return super()._achieved_ticks(cost, dtype)
        arithmetic, memory = self.split_ticks(cost, dtype)
        return arithmetic + memory

    def split_ticks(self, cost, dtype) -> tuple[int, int]:
        """(ticks of the op's arithmetic, ticks of its memory traffic), each at its achieved fraction of peak."""
        eff, half = self.efficiency, dtype in (torch.float16, torch.bfloat16)
        product = cost.kind in PRODUCTS
        rate = self.flops_per_tick * ((self.half_precision_speedup if product else eff.vector_half_speedup)
                                      if half else 1)
        arithmetic = Efficiency.at(eff.matrix if product else eff.vector, cost.flops / 1e9)
        if cost.kind == "attention" and self.attention is not None:
            arithmetic = Fraction(self.attention)
        memory = Efficiency.at(eff.memory, cost.bytes / 1e6)
        return (-(-cost.flops * arithmetic.denominator // (rate * arithmetic.numerator)),
                -(-cost.bytes * memory.denominator // (self.memory_bytes_per_tick * memory.numerator)))

    def scaled(self, fraction, name: str) -> CalculonDevice:
        """The same device with every product's achieved fraction of peak (the curve's, and attention's) times
        `fraction`: what a fitted share of Calculon's matrix efficiency means."""
        attention = None if self.attention is None else min(Fraction(1), Fraction(self.attention) * fraction)
        return dataclasses.replace(self, name=name, efficiency=self.efficiency.scaled(Fraction(fraction)),
                                   attention=attention)

    def describe(self) -> str:
        mode = ("arithmetic time plus memory time (Calculon's no_overlap)" if self.processing == PROCESSING_SUM
                else "the larger of arithmetic and memory time (the roofline)")
        return f"{super().describe()}; an op takes {mode}"


CALCULON_CURVES = dict(matrix=MATRIX_EFFICIENCY, vector=VECTOR_EFFICIENCY, memory=MEMORY_EFFICIENCY)

A100_80GB_UNFITTED = CalculonDevice(
    "A100 SXM 80GB, nothing fitted", flops_per_tick=19_500, memory_bytes_per_tick=2_039, launch_ticks=0,
    half_precision_speedup=16,  # 312 / 19.5 TFLOP/s: tensor cores
    efficiency=Efficiency(**CALCULON_CURVES, vector_half_speedup=4))  # 78 / 19.5 TFLOP/s
A100_FITTED = Fraction("0.930")  # the fit set's, module docstring
A100_80GB = A100_80GB_UNFITTED.scaled(A100_FITTED, "A100 SXM 80GB")
A100_80GB_ROOFLINE = dataclasses.replace(A100_80GB_UNFITTED, name="A100 SXM 80GB (roofline)",
                                         processing=PROCESSING_ROOFLINE)

FLASH_ATTENTION_2_H100 = 2 * Fraction("0.35")  # of peak, on the simulator's count of a causal attention's FLOPs

H100_SXM = CalculonDevice(
    "H100 SXM 80GB", flops_per_tick=67_000, memory_bytes_per_tick=3_350, launch_ticks=0,
    half_precision_speedup=Fraction(989, 67),
    efficiency=Efficiency(**CALCULON_CURVES, vector_half_speedup=Fraction(120, 67)),
    attention=FLASH_ATTENTION_2_H100)

H100_GRAND_TETON_UNFITTED = dataclasses.replace(H100_SXM, name="H100 SXM 96GB HBM2e (Grand Teton, 500 W), "
                                                                "nothing fitted", memory_bytes_per_tick=2_400)
H100_FITTED = Fraction("0.8311")  # the fit set's, module docstring
H100_GRAND_TETON = H100_GRAND_TETON_UNFITTED.scaled(H100_FITTED, "H100 SXM 96GB HBM2e (Grand Teton, 500 W)")
