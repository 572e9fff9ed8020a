"""The papers' formulas a prediction is held to (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", arXiv 2205.05198; Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", arXiv 2104.04473).

s sequence length, b microbatch size, h hidden size, a heads, L layers, t tensor-parallel ranks, p pipeline
stages, v chunks per pipeline rank, m microbatches, V vocabulary; activations in half precision (2 bytes),
dropout masks 1 byte.

    activations per layer and microbatch, in bytes (Korthikanti et al., section 4):
        tensor parallel                          s·b·h·(10 + 24/t + 5·a·s/(h·t))
        + sequence parallel                      s·b·h/t·(34 + 5·a·s/h)
        + selective recomputation                s·b·h/t·34               (without SP: s·b·h·(10 + 24/t))
        full recomputation                       2·s·b·h                  (the layer's input; under SP /t)
      without dropout (the paper counts it): no 1-byte masks (2·s·b·h for the two after the products, a·s²·b
      in the attention) and no dropout output in the attention (2·a·s²·b): 34 -> 32 (10 -> 8) and
      5·a·s/h -> 2·a·s/h, the softmax's output kept once for its backward and the product with v
    the first pipeline stage holds the most: L/p layers for each of the p microbatches 1F1B keeps in flight, L
    layers in all; interleaved, L·(1 + (p-1)/(p·v)) (Korthikanti et al., section 4.2.3)
    weights and optimizer state: 18 bytes per weight (half-precision weights 2, float32 gradients 4, float32
        master weights and Adam's two moments 12), 12·h²·L/(t·p) weights per GPU (the layers' products)
    model FLOPs of one step: 72·B·s·L·h²·(1 + s/(6h) + V/(12·h·L)), B the global batch (Narayanan et al.,
        appendix); MFU = those FLOPs / (step time · peak · GPUs)
    the FLOPs Narayanan et al.'s Table 1 counts a step, recomputation's forward included (their equation 3):
        96·B·s·L·h²·(1 + s/(6h) + V/(16·h·L))
    bubble: (p - 1)/(v·m + p - 1) of the step (Narayanan et al., section 2.2)
"""

from __future__ import annotations

from fractions import Fraction

from .config import Config
from .schedule import warmup


def activation_bytes_per_layer(cfg: Config) -> Fraction:
    """Korthikanti et al.'s activation memory of one layer for one microbatch, on one GPU."""
    m, par = cfg.model, cfg.parallel
    s, b, h, a, t = m.seq, par.microbatch, m.hidden, m.heads, par.tensor
    sbh = Fraction(s * b * h)
    if cfg.recompute == "full":
        return 2 * sbh / (t if par.sequence_parallel else 1)
    masks = 2 if cfg.dropout > 0 else 0  # the two 1-byte dropout masks after the products
    attention = 0 if cfg.recompute == "selective" else Fraction((5 if cfg.dropout > 0 else 2) * a * s, h)
    if par.sequence_parallel:
        return sbh / t * (32 + masks + attention)
    return sbh * (8 + masks + Fraction(24, t) + attention / t)


def layers_in_flight(cfg: Config, stage: int = 0) -> int:
    """How many (layer, microbatch) activations rank `stage` holds at most: its forwards in flight times the
    layers of a chunk."""
    par = cfg.parallel
    in_flight = min(warmup(stage, par.pipeline, par.virtual, par.microbatches) + 1, par.microbatches * par.virtual)
    return in_flight * cfg.layers_per_chunk


def activation_bytes(cfg: Config, stage: int = 0) -> Fraction:
    """The paper's activation memory on pipeline rank `stage` (the first holds the most)."""
    return activation_bytes_per_layer(cfg) * layers_in_flight(cfg, stage)


def layer_weights_per_gpu(cfg: Config) -> int:
    """12·h²·L/(t·p): the weights of the layers' products on one GPU (the paper's count)."""
    m, par = cfg.model, cfg.parallel
    return 12 * m.hidden ** 2 * m.layers // (par.tensor * par.pipeline)


def model_flops(cfg: Config) -> int:
    """72·B·s·L·h²·(1 + s/(6h) + V/(12·h·L)): one step's FLOPs without recomputation (Narayanan et al.)."""
    m, par = cfg.model, cfg.parallel
    s, h, L = m.seq, m.hidden, m.layers
    return int(72 * par.global_batch * s * L * h * h * (1 + Fraction(s, 6 * h) + Fraction(m.vocab, 12 * h * L)))


def narayanan_flops(cfg: Config) -> int:
    """96·B·s·L·h²·(1 + s/(6h) + V/(16·h·L)): Narayanan et al.'s equation 3, the FLOPs their Table 1's
    throughput counts (with full recomputation's second forward)."""
    m, par = cfg.model, cfg.parallel
    s, h, L = m.seq, m.hidden, m.layers
    return int(96 * par.global_batch * s * L * h * h * (1 + Fraction(s, 6 * h) + Fraction(m.vocab, 16 * h * L)))


def bubble(cfg: Config) -> Fraction:
    """(p - 1)/(v·m + p - 1): the share of the step a pipeline rank sits idle."""
    par = cfg.parallel
    return Fraction(par.pipeline - 1, par.virtual * par.microbatches + par.pipeline - 1)
