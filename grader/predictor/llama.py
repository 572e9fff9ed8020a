"""torchtitan's Llama 3 training step with FSDP, as a rank program on meta tensors (the H100 validation run).

The model (Llama 3.1 8B: 32 layers, hidden 4096, 32 heads of 128, 8 key-value heads, SwiGLU of width 14336,
vocabulary 128256): per block, on [b, s, h] in bfloat16,

    x ──┬── rms_norm ── q, k, v = @wq, @wk, @wv ── rotary ── repeat k, v to 32 heads ── flash attention ── @wo ──(+)
        └──────────────────────────────────────────────────────────────────────────────────────────────────────┘
    h ──┬── rms_norm ── silu(@w1) * (@w3) ── @w2 ──(+)── out
        └─────────────────────────────────────────┘

FSDP (torchtitan's fully_shard per block, and the root: embeddings, final norm, output): each rank keeps 1/N of
every unit's weights in float32, with their gradients and AdamW's two moments (16 bytes a weight, / N); a unit's
weights are all-gathered in bfloat16 before its forward, freed after it, gathered again for its backward; its
gradients, made in bfloat16, are reduce-scattered in float32. The last block keeps its weights between forward
and backward (torchtitan's reshard_after_forward is False for it). With fsdp_overlap (config.py, FSDP2's
behaviour): the next unit's all-gather is issued before this one's compute, so it runs under it (prefetch), and
each reduce-scatter is left running under the next unit's backward, waited for before the next one is issued
(FSDP2 keeps one in flight); without: each gathered when needed and each reduced before going on. One
communication queue carries both, as one NCCL communicator does.

Selective activation checkpointing, torchtitan's "op" policy: in each block, autograd keeps the block's input, the
outputs of the odd-numbered matrix products (q, v, w1, w2: every other one) and the attention's output; backward
runs the block's forward again, taking those from the cache and recomputing the rest (the even products, the
norms, rotary, SwiGLU's elementwise ops).

One simulated rank stands for the N ranks of the FSDP group (cluster.py's stand-in): its all-gathers and
reduce-scatters move its own piece and are charged as the group's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .config import Config
from .tensor_parallel import TensorParallel

BF16, F32 = torch.bfloat16, torch.float32
SAVED_PRODUCTS = ("wq", "wv", "w1", "w2")  # torchtitan's op policy: every other mm's output is kept


def block_shapes(cfg: Config) -> dict:
    m = cfg.model
    h, kv = m.hidden, m.kv * m.head_dim
    return {"attention_norm": (h,), "wq": (h, h), "wk": (h, kv), "wv": (h, kv), "wo": (h, h), "ffn_norm": (h,),
            "w1": (h, m.ffn_width), "w3": (h, m.ffn_width), "w2": (m.ffn_width, h)}


def root_shapes(cfg: Config) -> dict:
    m = cfg.model
    return {"tok_embeddings": (m.vocab, m.hidden), "norm": (m.hidden,), "output": (m.hidden, m.vocab)}


def rms_norm(x, weight, eps: float = 1e-5):
    """As torch's eager RMS norm runs it on a GPU: in float32, scaled, cast back."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rotary(x, cos, sin):
    """Rotary positions on [b, s, heads, d], in float32 (torchtitan multiplies complex numbers in float32)."""
    x32 = x.float()
    half = x32.shape[-1] // 2
    rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * cos + rotated * sin).type_as(x)


class _Box:
    """A tensor handed to an autograd Function without being one of its inputs."""

    def __init__(self, value):
        self.value = value


class CachedProduct(torch.autograd.Function):
    """a @ w whose output the checkpoint kept: returns it, and has the product's gradients."""

    @staticmethod
    def forward(ctx, a, w, box):
        ctx.save_for_backward(a, w)
        return box.value

    @staticmethod
    def backward(ctx, grad):
        a, w = ctx.saved_tensors
        return grad @ w.t(), a.reshape(-1, a.shape[-1]).t() @ grad.reshape(-1, grad.shape[-1]), None


class CachedAttention(torch.autograd.Function):
    """Flash attention whose output (and log-sum-exp) the checkpoint kept; backward is flash attention's."""

    @staticmethod
    def forward(ctx, q, k, v, box):
        out, rest = box.value
        ctx.save_for_backward(q, k, v, out, *rest[:2], *rest[4:6])
        ctx.sizes = rest[2:4]
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, cum_q, seed, offset = ctx.saved_tensors[:8]
        cum_k = cum_q
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            grad.contiguous(), q, k, v, out, lse, cum_q, cum_k, *ctx.sizes, 0.0, True, seed, offset)
        return dq, dk, dv, None


def flash_attention(q, k, v):
    """Causal attention on [b, heads, s, d] (PyTorch's flash kernel). Returns (out, what its backward needs)."""
    outputs = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)
    out, lse, cum_q, cum_k, max_q, max_k, seed, offset = outputs[:8]
    return out, (lse, cum_q, max_q, max_k, seed, offset)


class Block:
    """One block's forward, in three modes: plain autograd; `record` (the checkpoint's forward: no grad, the kept
    outputs into `cache`); `replay` (backward's: the kept outputs from `cache`, the rest recomputed)."""

    def __init__(self, cfg: Config, cos, sin):
        self.cfg, self.cos, self.sin = cfg, cos, sin

    def product(self, name, a, w, mode, cache):
        if mode == "replay" and name in cache:
            return CachedProduct.apply(a, w, _Box(cache[name]))
        out = a @ w
        if mode == "record" and name in SAVED_PRODUCTS:
            cache[name] = out
        return out

    def attention(self, q, k, v, mode, cache):
        if mode == "replay":
            return CachedAttention.apply(q, k, v, _Box(cache["attention"]))
        if mode == "record":
            out, rest = flash_attention(q, k, v)
            cache["attention"] = (out, rest)
            return out
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0]

    def __call__(self, x, w: dict, mode: str = "plain", cache: dict | None = None):
        m = self.cfg.model
        b, s, h = x.shape
        heads, kv, d = m.heads, m.kv, m.head_dim
        n = rms_norm(x, w["attention_norm"])
        q = self.product("wq", n, w["wq"], mode, cache).view(b, s, heads, d)
        k = self.product("wk", n, w["wk"], mode, cache).view(b, s, kv, d)
        v = self.product("wv", n, w["wv"], mode, cache).view(b, s, kv, d)
        q, k = rotary(q, self.cos, self.sin), rotary(k, self.cos, self.sin)
        k = k.unsqueeze(3).expand(b, s, kv, heads // kv, d).reshape(b, s, heads, d)  # repeat_kv: a copy
        v = v.unsqueeze(3).expand(b, s, kv, heads // kv, d).reshape(b, s, heads, d)
        a = self.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mode, cache)
        a = a.transpose(1, 2).reshape(b, s, h)
        x = x + self.product("wo", a, w["wo"], mode, cache)
        n = rms_norm(x, w["ffn_norm"])
        gate = F.silu(self.product("w1", n, w["w1"], mode, cache)) * self.product("w3", n, w["w3"], mode, cache)
        return x + self.product("w2", gate, w["w2"], mode, cache)


@dataclass
class Unit:
    """One FSDP unit on one rank: its float32 shard, gradient shard and AdamW moments (flat), and the shapes of
    the bfloat16 weights it gathers."""

    shapes: dict
    shard: torch.Tensor
    grad: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for s in self.shapes.values())


def make_unit(shapes: dict, n: int, device) -> Unit:
    numel = sum(math.prod(s) for s in shapes.values())
    piece = -(-numel // n)
    return Unit(shapes, *(torch.empty(piece, dtype=F32, device=device) for _ in range(4)))


class Gathered:
    """A unit's weights all-gathered in bfloat16: issued now (asynchronously), waited for when used, then copied
    out of the all-gather's buffer into the unit's parameters (FSDP2's foreach_all_gather_copy_out, one
    split_with_sizes_copy over the whole buffer; the buffer is freed after it)."""

    def __init__(self, unit: Unit, group: TensorParallel):
        self.unit = unit
        self.flat, self.handle = group.all_gather(unit.shard.to(BF16), async_op=True)

    def weights(self, requires_grad: bool = False) -> dict:
        if self.handle is not None:
            self.handle.wait()
            self.handle = None
            self.flat = self.flat.clone()  # the copy-out
        flat = self.flat.detach().requires_grad_(requires_grad)
        self.leaf, out, at = flat, {}, 0
        for name, shape in self.unit.shapes.items():
            size = math.prod(shape)
            out[name] = flat[at: at + size].view(shape)
            at += size
        return out


class Reducing:
    """A unit's reduce-scatter in flight: the float32 gradient it reads, its shard, its handle."""

    def __init__(self, gathered: Gathered, group: TensorParallel):
        self.unit = gathered.unit
        self.full = gathered.leaf.grad.to(F32)
        gathered.leaf.grad = None
        self.shard, self.handle = group.reduce_scatter(self.full, async_op=True)

    def finish(self) -> None:
        if self.handle is not None:
            self.handle.wait()
        self.full = None
        self.unit.grad.add_(self.shard)


def reduce_gradients(gathered: Gathered, step: LlamaStep) -> None:
    """The unit's bfloat16 gradient, in float32, reduce-scattered into its gradient shard: waited for now, or
    (fsdp_overlap) when the next unit's is issued or the optimizer needs it."""
    if step.reducing is not None:
        step.reducing.finish()
        step.reducing = None
    reducing = Reducing(gathered, step.group)
    if step.cfg.fsdp_overlap:
        step.reducing = reducing
    else:
        reducing.finish()


class CheckpointedBlock(torch.autograd.Function):
    """One FSDP block under torchtitan's selective checkpointing: forward with its gathered weights and no graph
    (the kept outputs cached); backward gathers the weights again, replays the block and reduce-scatters its
    gradients. apply(x, step, i) with `step` the LlamaStep."""

    @staticmethod
    def forward(ctx, x, step, i):
        ctx.step, ctx.i, ctx.cache = step, i, {}
        gathered = step.gather_for_forward(i)
        with torch.no_grad():
            y = step.block(x, gathered.weights(), "record", ctx.cache)
        step.done_forward(i)
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        step, i = ctx.step, ctx.i
        gathered = step.gather_for_backward(i)
        x = x.detach().requires_grad_()
        with torch.enable_grad(), torch.profiler.record_function("recompute"):
            y = step.block(x, gathered.weights(requires_grad=True), "replay", ctx.cache)
        torch.autograd.backward(y, grad)
        reduce_gradients(gathered, step)
        step.done_backward(i)
        return x.grad, None, None


class LlamaStep:
    """The state of one rank's step: its units, the FSDP group, what is gathered now."""

    def __init__(self, dist, cfg: Config, group: TensorParallel, device):
        m = cfg.model
        self.cfg, self.group, self.device = cfg, group, device
        n = cfg.parallel.data
        self.blocks = [make_unit(block_shapes(cfg), n, device) for _ in range(m.layers)]
        self.root = make_unit(root_shapes(cfg), n, device)
        s, d = m.seq, m.head_dim
        self.cos = torch.empty((s, 1, d), dtype=F32, device=device)  # rotary tables, computed once
        self.sin = torch.empty((s, 1, d), dtype=F32, device=device)
        self.block = Block(cfg, self.cos, self.sin)
        self.gathered = {}
        self.reducing = None  # the reduce-scatter in flight (fsdp_overlap)
        self.prefetch = cfg.fsdp_overlap

    def _gather(self, i):
        if i not in self.gathered and 0 <= i < len(self.blocks):
            self.gathered[i] = Gathered(self.blocks[i], self.group)
        return self.gathered.get(i)

    def gather_for_forward(self, i):
        current = self._gather(i)
        if self.prefetch:
            self._gather(i + 1)
        return current

    def done_forward(self, i):
        if i < len(self.blocks) - 1:  # resharded; the last block's weights stay for its backward
            self.gathered.pop(i, None)

    def gather_for_backward(self, i):
        current = self._gather(i)
        if self.prefetch:
            self._gather(i - 1)
        return current

    def done_backward(self, i):
        self.gathered.pop(i, None)


def llama_step(dist, cfg: Config, tally_cost=None, tally_rank: int = 0):
    """The rank program: one torchtitan training step of `cfg` (a Llama model, FSDP over its D = N ranks)."""
    from .step import StepFigures, tally_figures, tally_model  # the figures a rank reports are the GPT step's
    from puzzles import sim

    m, par = cfg.model, cfg.parallel
    device = torch.device("meta")
    n = par.data
    group = TensorParallel(dist, dist.new_group([dist.get_rank()]), n, 0, stand_in=True, cost=tally_cost)
    figures = StepFigures()
    step = LlamaStep(dist, cfg, group, device)
    units = step.blocks + [step.root]
    shard_numel = sum(u.shard.numel() for u in units)
    figures.weights, figures.gradients, figures.optimizer = 4 * shard_numel, 4 * shard_numel, 8 * shard_numel
    ledger = sim.current_ledger()
    static = ledger.current if ledger is not None else 0
    tokens = torch.empty((par.microbatch, m.seq), dtype=torch.long, device=device)
    for unit in units:
        unit.grad.zero_()
    counted = sim.tally(tally_model(tally_cost)) if tally_cost is not None and dist.get_rank() == tally_rank else None
    if counted is not None:
        counted.__enter__()
    with torch.profiler.record_function("F0"):
        root = Gathered(step.root, group)
        rw = root.weights(requires_grad=True)
        x = F.embedding(tokens, rw["tok_embeddings"])
        for i in range(m.layers):
            x = CheckpointedBlock.apply(x, step, i)
        logits = rms_norm(x, rw["norm"]) @ rw["output"]  # [b, s, V]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten(0, 1))
        if ledger is not None:
            figures.held.append(ledger.current - static)
    with torch.profiler.record_function("B0"):
        loss.backward()
        reduce_gradients(root, step)
        if step.reducing is not None:  # the last one in flight, before the optimizer reads the shards
            step.reducing.finish()
            step.reducing = None
    with torch.profiler.record_function("optimizer"):
        for unit in units:
            torch._fused_adamw_([unit.shard], [unit.grad], [unit.exp_avg], [unit.exp_avg_sq], [],
                                [torch.zeros((), dtype=F32, device=device)], lr=3e-4, beta1=0.9, beta2=0.95,
                                weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)
    if counted is not None:
        counted.__exit__(None, None, None)
        figures.tally = tally_figures(counted, tally_cost)
    figures.layers_held = list(figures.held)
    return figures
