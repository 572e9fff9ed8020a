"""The published runs as configurations (`python -m grader predict --preset NAME`); their measured figures, their
sources and the split into a fitting and a held-out set are in published.py.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models" (arXiv 2205.05198),
Tables 3 and 5: GPT models on DGX A100 80GB nodes, sequence 2048, vocabulary 51200, fp16, one data-parallel
replica, each with full recomputation (no sequence parallelism) and with sequence parallelism and selective
recomputation. The interleaving and microbatch sizes are Calculon's validation inputs (github.com/calculon-ai/
calculon at caa4b11, validation/seqsel/tab5/*.json).

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (arXiv
2104.04473), Table 1: GPT models of 1.7B to 1T parameters on 32 to 3072 A100s (Selene), sequence 2048,
vocabulary 51200, fp16, full recomputation. The microbatch sizes, the interleaving and the data-parallel
implementation are Megatron-LM's own script for that table (github.com/NVIDIA/Megatron-LM at 6985e58,
examples/sc21/run_table_1.sh: MBS, --num-layers-per-virtual-pipeline-stage, --DDP-impl).

Smith et al. 2022, "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B" (arXiv 2201.11990), section
2.4: the 530B model (105 layers, hidden 20480, 128 heads) with 8-way tensor and 35-way pipeline parallelism on
280, 350 and 420 DGX A100 nodes, global batch 1920. What the section does not say is marked where it is set.

torchtitan's Llama 3.1 8B (github.com/pytorch/torchtitan at eaea6f6, docs/performance.md, Tables 1 and 3) on
H100s of Grand Teton hosts (96 GB HBM2e, 500 W): FSDP over 8 or 128 GPUs, local batch 2 of 8,192 tokens,
selective (op) activation checkpointing, no torch.compile, no Float8.
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
    """What Korthikanti et al. give for one model: iteration times (s) with full recomputation and with sequence
    parallelism + selective recomputation (Table 5); the activation memory per GPU (GiB) without recomputation and
    with SP + selective, and the weights and optimizer state per GPU (GiB), of Figure 1. Figure 1's are the
    paper's formulas evaluated (exact binary fractions: 12.3515625), as Calculon's validation.py transcribes
    them, not a measurement."""

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
    """One of Korthikanti et al.'s runs: mode "full" (full recomputation, no SP), "seqsel" (SP + selective) or
    "none" (no recomputation, no SP: Figure 1's baseline, whose time was not published)."""
    model, t, p, v, mb, gb, _ = MEGATRON[name]
    sp, recompute = {"full": (False, "full"), "seqsel": (True, "selective"), "none": (False, "none")}[mode]
    # Megatron-LM of 2022 (55ba1f7, 2022-05-26): the backward's tensor-parallel collectives asynchronous
    # (--no-async-tensor-model-parallel-allreduce unset; SP's own), float32 main_grad with the fused
    # accumulation (Figure 1's 18 bytes a weight); D = 1, so no data-parallel reduction
    return Config(model, Parallel(tensor=t, pipeline=p, virtual=v, microbatch=mb, global_batch=gb,
                                  sequence_parallel=sp), recompute=recompute, cluster="a100", tp_overlap=True,
                  grad_dtype="float32")


@dataclass(frozen=True)
class WeakScaling:
    """One row of Narayanan et al.'s Table 1 (heads, hidden, layers, t, p, GPUs, batch, TFLOP/s per GPU) and what
    Megatron-LM's examples/sc21/run_table_1.sh ran it with (microbatch, layers per virtual stage, DDP)."""

    heads: int
    hidden: int
    layers: int
    tensor: int
    pipeline: int
    gpus: int
    batch: int
    tflops: int  # achieved teraFLOP/s per GPU, Table 1 (by the paper's equation 3, recomputation included)
    microbatch: int
    layers_per_virtual_stage: int  # 0: no interleaving
    ddp: str  # "torch" (PyTorch's DDP) or "local" (Megatron's own, after the pipeline has drained)


NARAYANAN = {
    "1.7B": WeakScaling(24, 2304, 24, 1, 1, 32, 512, 137, 16, 0, "torch"),
    "3.6B": WeakScaling(32, 3072, 30, 2, 1, 64, 512, 138, 16, 0, "torch"),
    "7.5B": WeakScaling(32, 4096, 36, 4, 1, 128, 512, 142, 16, 0, "torch"),
    "18B": WeakScaling(48, 6144, 40, 8, 1, 256, 1024, 135, 8, 0, "torch"),
    "39B": WeakScaling(64, 8192, 48, 8, 2, 512, 1536, 138, 4, 0, "local"),
    "76B": WeakScaling(80, 10240, 60, 8, 4, 1024, 1792, 140, 2, 5, "local"),
    "145B": WeakScaling(96, 12288, 80, 8, 8, 1536, 2304, 148, 2, 5, "local"),
    "310B": WeakScaling(128, 16384, 96, 8, 16, 1920, 2160, 155, 1, 3, "local"),
    "530B": WeakScaling(128, 20480, 105, 8, 35, 2520, 2520, 163, 1, 1, "local"),
    "1T": WeakScaling(160, 25600, 128, 8, 64, 3072, 3072, 163, 1, 0, "local"),
}


def narayanan(name: str) -> Config:
    """A row of Narayanan et al.'s Table 1 as Megatron-LM's script ran it: full recomputation
    (--activations-checkpoint-method uniform, one layer a checkpoint), fp16 (CONFIG.sh), dropout 0.1 (the
    default). The code of the time (a8d172b, 2021-04-28) kept fp16 gradients (no --accumulate-allreduce-grads-
    in-fp32), waited for each tensor-parallel collective where issued (the asynchronous all-reduce came in
    2021-09) and, with --DDP-impl local, all-reduced the gradients after the pipeline had drained
    (training.py's train_step); --DDP-impl torch is PyTorch's DDP, buckets all-reduced during the backward."""
    r = NARAYANAN[name]
    per_stage = r.layers // r.pipeline
    virtual = per_stage // r.layers_per_virtual_stage if r.layers_per_virtual_stage else 1
    data = r.gpus // (r.tensor * r.pipeline)
    model = Model(f"GPT {name}", layers=r.layers, hidden=r.hidden, heads=r.heads, seq=2048, vocab=51200)
    return Config(model, Parallel(tensor=r.tensor, pipeline=r.pipeline, data=data, virtual=virtual,
                                  microbatch=r.microbatch, global_batch=r.batch), recompute="full", cluster="a100",
                  tp_overlap=False, grad_dtype="half", dp_overlap=r.ddp == "torch")


MT_NLG_NODES = (280, 350, 420)  # DGX A100 nodes of Smith et al.'s section 2.4


def mt_nlg(nodes: int) -> Config:
    """Megatron-Turing NLG 530B on `nodes` DGX A100s: t = 8 inside a node, p = 35, D = nodes / 35, global batch
    1920. Not in section 2.4, set here: microbatch 1, DeepSpeed's pipeline (1F1B, no interleaving), full
    recomputation, Megatron's vocabulary padded to 51200 (GPT-2's 50257 to a multiple of 128·t), and the
    Megatron-LM of 2021 it forked: fp16 gradients all-reduced after the pipeline has drained, tensor-parallel
    collectives waited for where issued."""
    return Config(GPT_530B, Parallel(tensor=8, pipeline=35, data=nodes // 35, microbatch=1, global_batch=1920),
                  recompute="full", cluster="a100", tp_overlap=False, grad_dtype="half", dp_overlap=False)


LLAMA_31_8B = Model("Llama 3.1 8B", layers=32, hidden=4096, heads=32, seq=8192, vocab=128256, ffn=14336, kv_heads=8,
                    style="llama")


def torchtitan_llama8b(gpus: int = 8) -> Config:
    """torchtitan's Llama 3.1 8B on `gpus` H100s of Grand Teton hosts: FSDP over all of them, local batch 2 of
    8,192 tokens, selective (op) activation checkpointing, bfloat16 with float32 gradient reduction (FSDP2's
    MixedPrecisionPolicy as torchtitan sets it), no dropout; FSDP2 prefetches the next all-gather and leaves
    each reduce-scatter running on a stream of its own."""
    return Config(LLAMA_31_8B, Parallel(data=gpus, microbatch=2, global_batch=2 * gpus), recompute="selective",
                  cluster="h100-grand-teton", dtype="bfloat16", dropout=0.0, data_parallel="fsdp",
                  fsdp_overlap=True)


def presets() -> dict[str, Config]:
    """Every named configuration `python -m grader predict --preset NAME` knows."""
    out = {}
    for name in MEGATRON:
        for mode in ("full", "seqsel", "none"):
            out[f"megatron-{name.lower()}-{mode}"] = megatron(name, mode)
    for name in NARAYANAN:
        out[f"narayanan-{name.lower()}"] = narayanan(name)
    for nodes in MT_NLG_NODES:
        out[f"mt-nlg-530b-{nodes}-nodes"] = mt_nlg(nodes)
    out["torchtitan-llama3-8b"] = torchtitan_llama8b(8)
    out["torchtitan-llama3-8b-128"] = torchtitan_llama8b(128)
    return out
