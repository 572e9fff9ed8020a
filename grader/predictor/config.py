"""A training configuration at scale: the model, how it is split over GPUs, what is recomputed, the cluster.

    Model      layers, hidden, heads, seq, vocab (+ FFN width, KV heads, norm, MLP kind for Llama-style models)
    Parallel   tensor (t), pipeline (p), data (D), virtual stages per pipeline rank (v, the interleaved
               schedule), microbatch size, global batch; sequence parallelism on or off
    recompute  "none", "selective" (the attention's core, Korthikanti et al. 2022) or "full" (every layer)
    overlap    which communication runs under compute: the tensor-parallel collectives of a column-parallel
               product's backward (Megatron-LM's), the data-parallel gradient reduction (bucketed, under the last
               backward: PyTorch's DDP), FSDP's all-gathers (prefetched) and reduce-scatters (asynchronous)

The number of microbatches each pipeline runs is m = global batch / (microbatch · D).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

RECOMPUTE = ("none", "selective", "full")
GRAD_DTYPES = ("float32", "half")


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer. GPT (Megatron-LM's): layer norm, a GELU MLP of width 4·hidden, learned
    positions, tied input and output embeddings. Llama: RMS norm, a SwiGLU MLP, rotary positions (no weights),
    grouped-query attention (kv_heads < heads), untied output embeddings."""

    name: str
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn: int = 0  # 0: 4·hidden
    kv_heads: int = 0  # 0: heads
    style: str = "gpt"  # "gpt" or "llama"

    @property
    def ffn_width(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class Parallel:
    """How the model is split: t tensor-parallel ranks (a node's GPUs), p pipeline stages, D data-parallel
    replicas, v model chunks per pipeline rank (v > 1: the interleaved 1F1B schedule)."""

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    virtual: int = 1
    microbatch: int = 1
    global_batch: int = 1
    sequence_parallel: bool = False

    @property
    def microbatches(self) -> int:
        return self.global_batch // (self.microbatch * self.data)

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline * self.data


@dataclass(frozen=True)
class Config:
    """One training step to predict."""

    model: Model
    parallel: Parallel
    recompute: str = "none"
    cluster: str = "a100"  # a key of cluster.CLUSTERS
    dtype: str = "float16"  # the weights' and activations' dtype; the optimizer's states are float32
    dropout: float = 0.1  # Megatron-LM's default (attention and hidden dropout); 0: no dropout kernels or masks
    simulate_tensor_ranks: str = "one"  # "one": one rank stands for its tensor-parallel group; "all"
    # Megatron-LM (since 2021-09, f3e57f6; with sequence parallelism since its first version) issues a
    # column-parallel product's backward collectives asynchronously: the all-gather of the input under the input
    # gradient's product, the all-reduce (SP: reduce-scatter) of the input gradient under the weight gradient's.
    # False: each waited for where it is issued (Megatron-LM of early 2021).
    tp_overlap: bool = True
    # How the D replicas share the work: "ddp", every replica holds the whole model and their gradients are
    # all-reduced (by formula over the simulated replica's timeline, runner.py); "fsdp", every weight sharded over
    # the D ranks (torchtitan's FSDP, simulated: one rank stands for the D of them).
    data_parallel: str = "ddp"
    # DDP: the gradients all-reduced in buckets as the last microbatch's backward makes them (PyTorch's DDP,
    # Megatron-LM's --overlap-grad-reduce); False: all at once after the pipeline has drained (Megatron-LM's
    # local DDP of 2021-2022)
    dp_overlap: bool = True
    # the gradients' dtype, kept and all-reduced: "float32" (Megatron-LM's main_grad, accumulated by the
    # weight gradient's fused product); "half" (the weights' dtype: autograd's gradients, accumulated by an
    # addition after each product, as Megatron-LM of 2021 kept them)
    grad_dtype: str = "float32"
    # FSDP: the next unit's all-gather issued before this one's compute (prefetch) and each reduce-scatter left
    # running under the next unit's backward; False: each gathered when needed and reduced before going on
    fsdp_overlap: bool = True

    def __post_init__(self):
        m, par = self.model, self.parallel
        problems = []
        if self.recompute not in RECOMPUTE:
            problems.append(f"recompute is one of {RECOMPUTE}, not {self.recompute!r}")
        if m.hidden % m.heads or m.heads % par.tensor or m.kv % par.tensor:
            problems.append(f"the heads ({m.heads}, {m.kv} for keys and values) split evenly over t = "
                            f"{par.tensor} ranks and the hidden size {m.hidden} over the heads")
        if m.ffn_width % par.tensor or m.vocab % par.tensor:
            problems.append(f"the FFN width {m.ffn_width} and the vocabulary {m.vocab} split over t = {par.tensor}")
        if m.layers % (par.pipeline * par.virtual):
            problems.append(f"{m.layers} layers split into p·v = {par.pipeline * par.virtual} chunks")
        if par.global_batch % (par.microbatch * par.data):
            problems.append(f"the global batch {par.global_batch} splits into microbatches of {par.microbatch} on "
                            f"D = {par.data} replicas")
        if par.virtual > 1 and par.microbatches % par.pipeline:
            problems.append(f"the interleaved schedule runs m = {par.microbatches} microbatches in groups of p = "
                            f"{par.pipeline} (Megatron-LM's rule)")
        if par.sequence_parallel and m.seq % par.tensor:
            problems.append(f"sequence parallelism splits the {m.seq} tokens over t = {par.tensor} ranks")
        if self.data_parallel not in ("ddp", "fsdp") or (self.data_parallel == "fsdp") != (m.style == "llama"):
            problems.append("data_parallel is 'ddp' (the GPT) or 'fsdp' (the Llama model, whose step is FSDP's)")
        if m.style == "llama" and (par.tensor, par.pipeline, par.virtual) != (1, 1, 1):
            problems.append("the Llama step is FSDP alone: tensor, pipeline and virtual stages of 1")
        if self.simulate_tensor_ranks not in ("one", "all"):
            problems.append("simulate_tensor_ranks is 'one' or 'all'")
        if self.grad_dtype not in GRAD_DTYPES:
            problems.append(f"grad_dtype is one of {GRAD_DTYPES}, not {self.grad_dtype!r}")
        if not 0 <= self.dropout < 1:
            problems.append(f"dropout is a probability in [0, 1), not {self.dropout}")
        if problems:
            raise ValueError("this configuration cannot run: " + "; ".join(problems))

    @property
    def layers_per_chunk(self) -> int:
        return self.model.layers // (self.parallel.pipeline * self.parallel.virtual)

    @property
    def stand_in(self) -> bool:
        """One simulated rank per stage stands for its tensor-parallel group."""
        return self.simulate_tensor_ranks == "one" and self.parallel.tensor > 1

    @property
    def simulated_ranks(self) -> int:
        if self.data_parallel == "fsdp":
            return 1  # one rank stands for the D ranks of the FSDP group
        return self.parallel.pipeline * (1 if self.stand_in else self.parallel.tensor)

    def but(self, **changes) -> Config:
        """A copy with some fields changed (model and parallel fields too: but(layers=4, pipeline=2))."""
        model = {k: v for k, v in changes.items() if k in Model.__dataclass_fields__}
        parallel = {k: v for k, v in changes.items() if k in Parallel.__dataclass_fields__}
        own = {k: v for k, v in changes.items() if k not in model and k not in parallel}
        return replace(self, model=replace(self.model, **model), parallel=replace(self.parallel, **parallel), **own)
