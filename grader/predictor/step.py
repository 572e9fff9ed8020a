"""One Megatron-LM training step of a GPT, as the rank program of one replica: what `python -m grader predict`
runs on the simulator, on meta tensors (shapes, no values).

Ranks. A replica has t·p GPUs. Either every one is a simulated rank (rank = tp + t·stage), or (the default) one
rank per stage stands for its t tensor-parallel GPUs: then rank = stage, its tensor-parallel group is itself, and
the cluster's cost model charges that group's collectives as t GPUs' (cluster.py). The D
replicas do the same work on other data; their one all-reduce of the gradients is charged by its formula
(formulas.py), not simulated.

The step, on every rank:

    zero the gradient buffer
    the pipeline schedule (schedule.py): each chunk's forward and backward for every microbatch (gpt.py)
    all-reduce the tied word embedding's gradient between the first and last stage; under sequence
    parallelism, the gradients of the weights every rank of a group holds whole (norms, row-parallel biases)
    the gradient norm (its square summed over the model-parallel ranks), and Adam on the float32 master weights,
    copied back into the half-precision weights

Memory, by kind, as Megatron-LM keeps it (18 bytes per weight): the weights in half precision (2), a float32
gradient buffer (4; 2 with grad_dtype "half", Megatron-LM of 2021, whose optimizer copies the gradients to
float32 for the step), the optimizer's float32 master weights and two moments (12). Each kind is one flat buffer
per rank, the weights views into it; whatever else the ledger holds is activations (and, at the peak, the
workspace of the op running then).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.autograd import Variable

from puzzles import sim

from .config import Config
from .gpt import Embedding, Layer, LayerWeights, causal_bias, embed, head_loss, layers_forward
from .schedule import Pipe, run_schedule
from .tensor_parallel import TensorParallel

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class Flat:
    """One rank's weights as views into flat buffers: `params` (half precision), `main_grad` (float32 or the
    weights' dtype, config.py's grad_dtype), the
    optimizer's float32 `master`, `exp_avg`, `exp_avg_sq`. `whole` is the range of the weights each rank of a
    tensor-parallel group holds whole and, under sequence parallelism, sees only its tokens of."""

    params: torch.Tensor
    main_grad: torch.Tensor
    master: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    whole: tuple = (0, 0)
    at: int = 0

    def take(self, shape, autograd_grad: bool = False) -> torch.Tensor:
        """The next weight of `shape`: a view into params, with .main_grad its view into main_grad. A weight
        whose gradient autograd computes (norms, biases added outside the products, embeddings) gets a hook that
        adds it into main_grad and drops it, as Megatron's gradient-accumulation hooks do."""
        n = 1
        for d in shape:
            n *= d
        w = self.params[self.at: self.at + n].view(shape).requires_grad_()
        w.main_grad = self.main_grad[self.at: self.at + n].view(shape)
        self.at += n
        if autograd_grad:
            w.register_post_accumulate_grad_hook(_into_main_grad)
        return w


def _into_main_grad(w: torch.Tensor) -> None:
    w.main_grad.add_(w.grad)
    w.grad = None


@dataclass
class Chunk:
    layers: list
    embedding: Embedding | None = None
    head: tuple | None = None  # (final norm weight, final norm bias, word embedding)


@dataclass
class StepFigures:
    """What a rank reports besides the simulator's own figures."""

    weights: int = 0
    gradients: int = 0
    optimizer: int = 0
    held: list = field(default_factory=list)  # activation bytes alive after each forward unit
    layers_held: list = field(default_factory=list)  # of which the transformer layers' (what the formulas count)
    tally: dict = field(default_factory=dict)  # ticks, FLOPs and ops by class of op
    chunk_gradients: list = field(default_factory=list)  # bytes of gradient of each model chunk (DP's buckets)


def chunk_sizes(cfg: Config, stage: int, chunk: int) -> tuple[int, int]:
    """(weights of this chunk held whole by each tensor-parallel rank, weights split over them), per rank."""
    m, t = cfg.model, cfg.parallel.tensor
    h, ffn = m.hidden, m.ffn_width
    whole_per_layer = 6 * h  # 2 norms (weight, bias) and the row-parallel biases
    split_per_layer = sum(_numel(s) for s in LayerWeights.shapes(h, ffn, t).values()) - whole_per_layer
    first = chunk == 0 and stage == 0
    last = chunk == cfg.parallel.virtual - 1 and stage == cfg.parallel.pipeline - 1
    whole = cfg.layers_per_chunk * whole_per_layer + (2 * h if last else 0) + (m.seq * h if first else 0)
    split = cfg.layers_per_chunk * split_per_layer + (m.vocab // t * h if first else 0) + (
        m.vocab // t * h if last and not first else 0)
    return whole, split


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


WHOLE = ("ln1_w", "ln1_b", "ln2_w", "ln2_b", "proj_b", "fc2_b")  # a layer's weights each rank holds whole


def build_chunks(cfg: Config, stage: int, tp: TensorParallel, device, ops=None) -> tuple[Flat, list[Chunk]]:
    """This rank's weights, each kind one flat buffer, and its model chunks. The weights every rank of the
    group holds whole come first, so that their gradients are one range to all-reduce."""
    m, par = cfg.model, cfg.parallel
    t, dtype = par.tensor, DTYPES[cfg.dtype]
    sizes = [chunk_sizes(cfg, stage, c) for c in range(par.virtual)]
    whole, total = sum(w for w, _ in sizes), sum(w + s for w, s in sizes)
    grad_dtype = torch.float32 if cfg.grad_dtype == "float32" else dtype
    flat = Flat(torch.empty(total, dtype=dtype, device=device), torch.empty(total, dtype=grad_dtype, device=device),
                *(torch.empty(total, dtype=torch.float32, device=device) for _ in range(3)), whole=(0, whole))
    shapes = LayerWeights.shapes(m.hidden, m.ffn_width, t)
    ends = [(c == 0 and stage == 0, c == par.virtual - 1 and stage == par.pipeline - 1) for c in range(par.virtual)]
    whole_weights = []
    for first, last in ends:
        layers = [{k: flat.take(shapes[k], autograd_grad=True) for k in WHOLE} for _ in range(cfg.layers_per_chunk)]
        final = (flat.take((m.hidden,), True), flat.take((m.hidden,), True)) if last else None
        positions = flat.take((m.seq, m.hidden), True) if first else None
        whole_weights.append((layers, final, positions))
    assert flat.at == whole, (flat.at, whole)
    chunks = []
    for (first, last), (layers, final, positions) in zip(ends, whole_weights):
        built = [Layer(LayerWeights(**w, **{k: flat.take(s) for k, s in shapes.items() if k not in WHOLE}), tp,
                       m.heads // t, par.sequence_parallel, cfg.dropout, cfg.recompute, ops) for w in layers]
        words = flat.take((m.vocab // t, m.hidden), autograd_grad=first) if first or last else None
        chunks.append(Chunk(built, Embedding(words, positions, tp.rank * (m.vocab // t)) if first else None,
                            (*final, words) if last else None))
    assert flat.at == total, (flat.at, total)
    return flat, chunks


def gpt_step(dist, cfg: Config, tally_cost=None, tally_rank: int = 0, ops=None):
    """The rank program: one training step of `cfg` on this rank. Returns its StepFigures; rank `tally_rank`
    also counts its ops by class on `tally_cost` (sim.tally), when given. `ops`: the learner's tensor- or
    sequence-parallel operators for the layers (gpt.LayerOps), None for the reference's."""
    if tally_cost is not None and dist.get_rank() == tally_rank:
        with sim.tally(tally_model(tally_cost)) as counted:
            figures = _gpt_step(dist, cfg, ops, tally_cost)
        figures.tally = tally_figures(counted, tally_cost)
        return figures
    return _gpt_step(dist, cfg, ops, tally_cost)


def tally_model(cost):
    """The cost model a tally counts with: the device alone, without the SMs collectives take (cluster.py)."""
    return cost.tally_model() if hasattr(cost, "tally_model") else cost


def tally_figures(counted, cost) -> dict:
    """A rank's tally as StepFigures keeps it, with the ticks the sharing of SMs added as a class of their own."""
    ticks = dict(counted.ticks_by_class)
    shared = cost.windows.extra() if hasattr(cost, "windows") else 0
    if shared:
        ticks["shared SMs"] = shared
    return {"ticks": ticks, "flops": dict(counted.flops_by_class), "ops": dict(counted.ops_by_class),
            "ticks_by_phase": dict(counted.ticks_by_phase)}


def _gpt_step(dist, cfg: Config, ops=None, cost=None) -> StepFigures:
    par, m = cfg.parallel, cfg.model
    t, p = par.tensor, par.pipeline
    rank = dist.get_rank()
    stand_in = cfg.stand_in
    stage, tp_rank = (rank, 0) if stand_in else (rank // t, rank % t)
    sims = 1 if stand_in else t  # simulated ranks per stage
    tp_groups = [dist.new_group([s * sims + i for i in range(sims)]) for s in range(p)]
    tp = TensorParallel(dist, tp_groups[stage], t, tp_rank, stand_in, cfg.tp_overlap, cost)
    embedding_group = None
    if p > 1:
        for i in range(sims):
            g = dist.new_group([i, (p - 1) * sims + i])
            if stage in (0, p - 1) and tp_rank == i:
                embedding_group = g
    device, dtype = torch.device("meta"), DTYPES[cfg.dtype]
    figures = StepFigures()
    flat, chunks = build_chunks(cfg, stage, tp, device, ops)
    n = flat.params.numel()
    figures.weights, figures.gradients = n * flat.params.element_size(), n * flat.main_grad.element_size()
    figures.chunk_gradients = [sum(chunk_sizes(cfg, stage, c)) * flat.main_grad.element_size()
                               for c in range(par.virtual)]
    figures.optimizer = 3 * n * 4
    static = figures.weights + figures.gradients + figures.optimizer
    ledger = sim.current_ledger()
    base = ledger.current if ledger is not None else 0  # what the rank held before its weights (nothing)
    base -= static

    s_local = m.seq // t if par.sequence_parallel else m.seq
    b = par.microbatch
    bias = causal_bias(m.seq, dtype, device)
    tokens = torch.empty((m.seq, b), dtype=torch.long, device=device)
    pipe = Pipe(dist, stage, [i * sims + tp_rank for i in range(p)], (s_local, b, m.hidden), dtype, device, tp,
                scatter=not par.sequence_parallel)
    saved = {}
    layer_bytes = {}  # forward unit -> what its layers left alive (their input included, their output not)
    micro = par.microbatches

    def forward(unit, x):
        chunk = chunks[unit.chunk]
        with torch.profiler.record_function(str(unit)):
            if chunk.embedding is not None:
                x = embed(tokens, chunk.embedding, tp, par.sequence_parallel, cfg.dropout)
                start = None
            else:
                x.requires_grad_()
                start = x
            before = ledger.current if ledger is not None else 0
            y = layers_forward(x, chunk.layers, bias)
            if ledger is not None:  # x was alive before and is kept; y is alive after and is the next's input
                layer_bytes[unit] = ledger.current - before
            if chunk.head is not None:
                y = head_loss(y, *chunk.head, tokens, tp, par.sequence_parallel, micro)
        saved[unit] = (start, y)
        if ledger is not None:
            figures.held.append(ledger.current - base - static)
            figures.layers_held.append(sum(layer_bytes.values()))
        return y

    def backward(unit, grad):
        forward_unit = unit.__class__(True, unit.chunk, unit.microbatch)
        start, y = saved.pop(forward_unit)
        layer_bytes.pop(forward_unit, None)
        with torch.profiler.record_function(str(unit)):
            if grad is None:
                y.backward()
            else:  # y's data was freed once sent (Megatron's deallocation): the engine is called without its check
                Variable._execution_engine.run_backward((y,), (grad,), False, False, (), True, True)
        return None if start is None else start.grad

    def sent(y):  # the activation a chunk sent on is needed for its graph only, not its values
        y.data = torch.empty((1,), dtype=y.dtype, device=y.device)

    with torch.profiler.record_function("zero gradients"):
        flat.main_grad.zero_()
    run_schedule(pipe, par.virtual, micro, forward, backward, sent=sent)
    with torch.profiler.record_function("optimizer"):
        optimizer_step(dist, cfg, flat, chunks, tp, stage, embedding_group, device)
    return figures


def optimizer_step(dist, cfg: Config, flat: Flat, chunks, tp: TensorParallel, stage: int, embedding_group,
                   device) -> None:
    """After the pipeline has drained (Megatron-LM's Float16OptimizerWithFloat16Params with apex's fused Adam):
    the tied embedding's gradient summed between the first and last stage; under SP the gradients of the weights
    each rank holds whole; the gradients unscaled (the loss scale of half-precision training) and checked for
    inf/NaN, the norm taken, each flag and sum all-reduced over the model-parallel ranks; Adam on the float32
    masters, copied back into the half-precision weights."""
    if embedding_group is not None:
        words = chunks[0].embedding.words if stage == 0 else chunks[-1].head[2]
        dist.all_reduce(words.main_grad, group=embedding_group)
    if cfg.parallel.sequence_parallel:
        lo, hi = flat.whole
        tp.all_reduce(flat.main_grad[lo:hi])
    # half-precision gradients are copied to float32 for the step (Megatron-LM's _copy_model_grads_to_main_grads)
    grads = flat.main_grad if flat.main_grad.dtype == torch.float32 else flat.main_grad.float()
    grads.mul_(1 / 65536)  # unscaled (apex checks for inf/NaN in the same pass)
    found_inf = torch.zeros((), dtype=torch.float32, device=device)
    dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)
    norm = torch.linalg.vector_norm(grads).pow_(2)
    dist.all_reduce(norm)
    step = torch.zeros((), dtype=torch.float32, device=device)
    torch._fused_adam_([flat.master], [grads], [flat.exp_avg], [flat.exp_avg_sq], [], [step],
                       lr=1e-4, beta1=0.9, beta2=0.95, weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)
    flat.params.copy_(flat.master)

