"""The published runs a prediction is validated against (bench/SCALE.md), as configurations.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models" (arXiv 2205.05198),
Tables 3 and 5 and Figure 1: GPT models on DGX A100 80GB nodes (8 GPUs, NVLink inside, HDR InfiniBand between),
sequence length 2048, vocabulary 51200, half precision, one data-parallel replica. Each model was run with full
recomputation (tensor parallelism's all-reduces, no sequence parallelism) and with sequence parallelism and
selective recomputation. The interleaved schedule's chunks per rank and the microbatch sizes are Calculon's
validation inputs (github.com/calculon-ai/calculon, validation/*_full.json and *_seqsel.json).

torchtitan's Llama 3.1 8B on 8 H100s (docs/performance.md, Table 1; the H100s of Grand Teton hosts: 96 GB HBM2e,
500 W): FSDP over the 8 GPUs, local batch 2 of 8,192 tokens, selective activation checkpointing, no
torch.compile, no Float8: 5,762 tokens per second per GPU, 82.4 GiB of memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import Config, Model, Parallel

GPT_22B = Model("GPT 22B", layers=48, hidden=6144, heads=64, seq=2048, vocab=51200)
GPT_175B = Model("GPT 175B", layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)
GPT_530B = Model("GPT 530B", layers=105, hidden=20480, heads=128, seq=2048, vocab=51200)
GPT_1T = Model("GPT 1T", layers=128, hidden=25600, heads=160, seq=2048, vocab=51200)


@dataclass(frozen=True)
class Published:
    """What the paper measured for one model: iteration times (s) with full recomputation and with sequence
    parallelism + selective recomputation (Table 5); activation memory per GPU (GiB, Figure 1) without
    recomputation and with SP + selective; the weights and optimizer state per GPU (GiB, Figure 1)."""

    full_seconds: float
    seqsel_seconds: float
    activations_none_gib: float
    activations_seqsel_gib: float
    weights_and_optimizer_gib: float


MEGATRON = {  # name: (model, t, p, v, microbatch, global batch, published)
    "22B": (GPT_22B, 8, 1, 1, 4, 4, Published(1.42, 1.10, 59.25, 9.5625, 45.5625)),
    "175B": (GPT_175B, 8, 8, 3, 1, 64, Published(18.13, 13.75, 66.84375, 12.3515625, 45.5625)),
    "530B": (GPT_530B, 8, 35, 3, 1, 280, Published(49.05, 37.83, 114.0234375, 23.076171875, 31.640625)),
    "1T": (GPT_1T, 8, 64, 1, 1, 512, Published(94.42, 71.49, 131.25, 26.5625, 32.958984375)),
}


def megatron(name: str, mode: str) -> Config:
    """One of the paper's runs: mode "full" (full recomputation, no SP), "seqsel" (SP + selective) or "none"
    (no recomputation, no SP: Figure 1's baseline, whose time was not published)."""
    model, t, p, v, mb, gb, _ = MEGATRON[name]
    sp, recompute = {"full": (False, "full"), "seqsel": (True, "selective"), "none": (False, "none")}[mode]
    return Config(model, Parallel(tensor=t, pipeline=p, virtual=v, microbatch=mb, global_batch=gb,
                                  sequence_parallel=sp), recompute=recompute, cluster="a100")


def presets() -> dict[str, Config]:
    """Every named configuration `python -m grader predict --preset NAME` knows."""
    out = {}
    for name in MEGATRON:
        for mode in ("full", "seqsel", "none"):
            out[f"megatron-{name.lower()}-{mode}"] = megatron(name, mode)
    out["torchtitan-llama3-8b"] = torchtitan_llama8b()
    return out


LLAMA_31_8B = Model("Llama 3.1 8B", layers=32, hidden=4096, heads=32, seq=8192, vocab=128256, ffn=14336, kv_heads=8,
                    style="llama")
TORCHTITAN_TOKENS_PER_SECOND, TORCHTITAN_MEMORY_GIB = 5762, 82.4  # per GPU


def torchtitan_llama8b() -> Config:
    """torchtitan's Llama 3.1 8B on 8 H100s of a Grand Teton host: FSDP, local batch 2 of 8,192 tokens (global
    16), selective (op) activation checkpointing, bfloat16, no dropout."""
    return Config(LLAMA_31_8B, Parallel(data=8, microbatch=2, global_batch=16), recompute="selective",
                  cluster="h100-grand-teton", dtype="bfloat16", dropout=0.0, data_parallel="fsdp",
                  overlap_communication=True)

