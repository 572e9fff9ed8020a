"""p18's training run: the state a checkpoint must hold, and one step of the job that writes it.

The job trains puzzle 8's model (L = 2 blocks, d = 32, h = 64: Ψ = 8,192 weights) with puzzle 8's ZeRO-sharded
Adam and puzzle 9's mixed precision: a float16 forward and backward with dropout, the float32 master weights and
Adam's moments sharded over the ranks, a dynamic loss scale (GradScaler's: x2 after 2 good steps in a row, /2 and
the step skipped at an overflow), a learning-rate schedule, and a data loader that draws a new order of the 96
samples at each epoch from the job's random generator. One sample's targets are 10,000 times larger, so the step
whose batch holds it overflows float16, once an epoch: Adam's step count falls behind the loop's.

The step is written so that any world size computes it the same way and the simulator and gloo agree bit for bit:
the gradients move by all_to_all_single (chunk j of every rank's gradient to rank j) and are summed on the rank in
rank order, the updated shards come back by all_gather_into_tensor, and the one random generator is the same on
every rank (it draws the whole batch's dropout masks, each rank using its rows). Nothing is reduced by a
collective's own arithmetic, whose order differs between backends.

This is the grader's code (the harness around the learner's save and load): the learner reads TrainingState's
fields in the puzzle's text, and may read this file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from puzzles.model import init_layers, make_batch

from ..p9_mixed_precision.serial import BACKOFF, BETAS, EPS, GROWTH, INIT_SCALE, OVERFLOW_TARGET

N, D, H, L = 4, 32, 64, 2
PSI = 2 * L * D * H  # weights
SAMPLES, BATCH = 96, 32  # a dataset of 96 samples, a global batch of 32: an epoch is 3 steps
EPOCH_STEPS = SAMPLES // BATCH
STEPS = 6  # the job's steps
SAVES = (2, 4)  # save_checkpoint runs after these steps
OVERFLOWS = (1, 5)  # the steps whose batch holds the sample with the huge targets (make_data picks it so)
GROWTH_INTERVAL = 4  # the scale doubles after 4 good steps in a row: so no save falls right after a change of it
DROPOUT = 0.1
LR, WARMUP, FLOOR = 1e-3, 2, 0.1  # linear warm-up over 2 steps, then a cosine down to 0.1·LR at step 6
SHAPES = [(D, H), (H, D)] * L  # the weights in flat order: layers[0].w1, layers[0].w2, layers[1].w1, ...


def learning_rate(lr_step: int) -> float:
    """The schedule at its step lr_step (0 at the first step): warm-up, then a cosine decay."""
    if lr_step < WARMUP:
        return LR * (lr_step + 1) / WARMUP
    progress = (lr_step - WARMUP) / (STEPS - WARMUP)
    return LR * (FLOOR + (1 - FLOOR) * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass
class TrainingState:
    """Everything a rank's training depends on, as the learner's save_checkpoint and load_checkpoint see it.

    step          steps run so far (skipped ones too); the loop saves after steps 2 and 4
    layers        [(w1, w2), (w1, w2)] float16, the same on every rank: the master weights rounded, which the
                  forward runs on (not written to a checkpoint: refresh_layers rebuilds them)
    master, m, v  float32 [Ψ/N]: this rank's shard of the flat master weights and of Adam's moments (elements
                  r·Ψ/N to (r+1)·Ψ/N of layers[0].w1, layers[0].w2, layers[1].w1, layers[1].w2, flattened)
    adam_steps    Adam's t: the steps taken (a skipped step is not counted)
    scale         the loss scale; good_steps: steps in a row without overflow since it last changed
    lr_step       the learning-rate schedule's own counter (torch's LRScheduler.last_epoch): one per step run
    generator     the job's torch.Generator, the same on every rank: dropout masks, and each epoch's order
    order         int64 [96]: this epoch's order of the samples; position: the next sample's index in it
    """

    step: int
    layers: list
    master: torch.Tensor
    m: torch.Tensor
    v: torch.Tensor
    adam_steps: int
    scale: float
    good_steps: int
    lr_step: int
    generator: torch.Generator
    order: torch.Tensor
    position: int

    def refresh_layers(self, dist) -> None:
        """Make `layers` the master weights rounded to float16: each rank rounds its shard, then an all-gather.
        Every rank calls it (load_checkpoint, after restoring the masters; each step, after the update)."""
        world = dist.get_world_size()
        if not isinstance(self.master, torch.Tensor) or self.master.numel() * world != PSI:
            held = self.master.numel() if isinstance(self.master, torch.Tensor) else type(self.master).__name__
            raise ValueError(f"refresh_layers: state.master holds {held} elements on rank {dist.get_rank()}; on "
                             f"{world} ranks each holds Ψ/{world} = {PSI // world:,} (its shard of the {PSI:,} "
                             f"weights), which this all-gathers into the float16 weights")
        with torch.no_grad():
            full = torch.empty(self.master.numel() * world, dtype=torch.float16)
            dist.all_gather_into_tensor(full, self.master.half())
            offset = 0
            for w in flat_weights(self.layers):
                w.copy_(full[offset:offset + w.numel()].view_as(w))
                offset += w.numel()


def unusable(state, world: int) -> str | None:
    """None when the step can run on `state` on a world of `world` ranks; else what is wrong with it, in words
    (the shards' sizes and dtypes, the numbers' types), checked right after load_checkpoint."""
    shard = PSI // world
    for name in ("master", "m", "v"):
        t = getattr(state, name, None)
        if not isinstance(t, torch.Tensor) or t.shape != (shard,) or t.dtype != torch.float32:
            what = f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}" if isinstance(t, torch.Tensor) else \
                type(t).__name__
            return (f"state.{name} is {what}, expected float32[{shard}] (this rank's shard of "
                    f"Ψ = {PSI:,} on {world} ranks)")
    for name in ("step", "adam_steps", "good_steps", "lr_step", "position"):
        value = getattr(state, name, None)
        if not isinstance(value, int) or isinstance(value, bool):
            return f"state.{name} is {value!r} ({type(value).__name__}), expected an int"
    if not isinstance(getattr(state, "scale", None), (int, float)):
        return f"state.scale is {state.scale!r}, expected a number"
    order = getattr(state, "order", None)
    if not isinstance(order, torch.Tensor) or order.shape != (SAMPLES,) or order.dtype != torch.int64:
        return f"state.order is not an int64[{SAMPLES}] tensor"
    try:
        weights = flat_weights(state.layers)
    except (TypeError, AttributeError):
        weights = []
    if len(weights) != 2 * L or any(not isinstance(w, torch.Tensor) or w.dtype != torch.float16 or
                                    not w.requires_grad or tuple(w.shape) != s for w, s in zip(weights, SHAPES)):
        return ("state.layers is not 2 pairs of float16 weights that require grad (leave "
                "them in place: state.refresh_layers(dist) writes into them)")
    return None


def flat_weights(layers) -> list:
    return [w for pair in layers for w in pair]


def make_data(seed: int):
    """The job's 96 samples, x float32 [96, 32] and targets float32 [96, 32], one sample's targets 10,000 times
    larger (the overflow of each epoch); and the initial weights, flat float32 [Ψ]."""
    x, target = make_batch(SAMPLES, D, seed)
    x, target = x.float(), target.float()
    target[outlier(seed)] *= OVERFLOW_TARGET
    start = torch.cat([w.reshape(-1) for pair in init_layers(L, D, H, seed + 1, requires_grad=False)
                       for w in pair]).float()
    return x, target, start


def epoch_order(generator: torch.Generator) -> torch.Tensor:
    """A new epoch's order of the samples: the generator's draw at the first step of an epoch."""
    return torch.randperm(SAMPLES, generator=generator)


def dropout_keep(generator: torch.Generator) -> list:
    """Each step's draw after the order: which hidden units each layer keeps, for the whole batch."""
    return [torch.rand(BATCH, H, generator=generator) >= DROPOUT for _ in range(L)]


def outlier(seed: int) -> int:
    """The sample whose targets are huge: one that the orders of the job's generator put in the batches of the
    steps OVERFLOWS, so that every seed overflows at those steps (found by drawing what the steps will draw)."""
    generator, orders = _seeded(seed), []
    for step in range(STEPS):
        if step % EPOCH_STEPS == 0:
            orders.append(epoch_order(generator))
        dropout_keep(generator)
    batches = [set(orders[(s - 1) // EPOCH_STEPS][(s - 1) % EPOCH_STEPS * BATCH:][:BATCH].tolist()) for s in OVERFLOWS]
    return min(set.intersection(*batches))


def fresh_state(rank: int, world: int, start: torch.Tensor, seed: int) -> TrainingState:
    """What a process has before it loads anything: the initial weights (its shard of them), zero moments, the
    initial scale and schedule, a freshly seeded generator, and the data loader at the start of an epoch."""
    shard = PSI // world
    master = start[rank * shard:(rank + 1) * shard].clone()
    layers, offset = [], 0
    for i in range(L):
        pair = []
        for shape in SHAPES[2 * i:2 * i + 2]:
            n = shape[0] * shape[1]
            pair.append(start[offset:offset + n].view(shape).half().requires_grad_())
            offset += n
        layers.append(tuple(pair))
    return TrainingState(0, layers, master, torch.zeros_like(master), torch.zeros_like(master), 0, INIT_SCALE, 0, 0,
                         _seeded(seed), torch.arange(SAMPLES), 0)


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed + 2)


def fresh_generator(seed: int) -> torch.Tensor:
    """The state of the job's generator before it drew anything."""
    return _seeded(seed).get_state()


def state_from(pieces: dict, seed: int) -> TrainingState:
    """A state made from `pieces` (what pieces() recorded, for this rank): the grader's own restore, which the
    control runs start from."""
    state = fresh_state(0, 1, pieces["weights"].float(), seed)
    state.master, state.m, state.v = pieces["master"].clone(), pieces["m"].clone(), pieces["v"].clone()
    state.generator.set_state(pieces["generator"].clone())
    state.order = pieces["order"].clone()
    for name in ("step", "adam_steps", "scale", "good_steps", "lr_step", "position"):
        setattr(state, name, pieces[name])
    return state


def next_batch(state: TrainingState) -> torch.Tensor:
    """The samples the next step will train on, read without drawing from the job's generator."""
    order = state.order
    if state.position == 0:
        peek = torch.Generator()
        peek.set_state(state.generator.get_state())
        order = epoch_order(peek)
    return order[state.position:state.position + BATCH].clone()


def train_step(dist, state: TrainingState, x: torch.Tensor, target: torch.Tensor) -> None:
    """One step of the job on this rank: its rows of the global batch, forward and backward in float16 with the
    loss scaled, every rank skips alike at an overflow, else the sharded Adam update and the weights gathered."""
    me, world = dist.get_rank(), dist.get_world_size()
    rows = slice(me * BATCH // world, (me + 1) * BATCH // world)
    if state.position == 0:  # a new epoch: a new order of the samples
        state.order = epoch_order(state.generator)
    batch = state.order[state.position:state.position + BATCH]
    state.position = (state.position + BATCH) % SAMPLES
    keep = dropout_keep(state.generator)  # the whole batch's masks, on every rank: the same for any world size
    h = x[batch[rows]].half()
    for (w1, w2), mask in zip(state.layers, keep):
        h = h + (F.gelu(h @ w1) * mask[rows].half() / (1 - DROPOUT)) @ w2
    loss = ((h.float() - target[batch[rows]]) ** 2).sum() / BATCH  # this rank's share of the batch's mean
    (loss * state.scale).backward()
    weights = flat_weights(state.layers)
    with torch.no_grad():
        grad = torch.cat([w.grad.reshape(-1) for w in weights])
        for w in weights:
            w.grad = None
        overflow = (~torch.isfinite(grad)).any().float().reshape(1)
        dist.all_reduce(overflow, op=dist.ReduceOp.MAX)  # one rank's overflow skips the step on every rank
        state.step += 1
        lr = learning_rate(state.lr_step)
        state.lr_step += 1
        if overflow.item():
            state.scale, state.good_steps = state.scale * BACKOFF, 0
            return
        unscaled = grad.float() / state.scale
        chunks = torch.empty_like(unscaled)
        dist.all_to_all_single(chunks, unscaled)  # chunk j of every rank's gradient goes to rank j
        g = chunks.view(world, -1).sum(0)  # this rank's shard of the batch's gradient
        state.adam_steps += 1
        t = state.adam_steps
        beta1, beta2 = BETAS
        state.m.mul_(beta1).add_(g, alpha=1.0 - beta1)
        state.v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)  # (not p9's line word for word: the release ships this file)
        state.master.addcdiv_(state.m, (state.v / (1 - beta2 ** t)).sqrt().add_(EPS), value=-lr / (1 - beta1 ** t))
    state.refresh_layers(dist)
    state.good_steps += 1
    if state.good_steps == GROWTH_INTERVAL:
        state.scale, state.good_steps = state.scale * GROWTH, 0


# --------------------------------------------------------------------------------------------------------------
# What is compared: every piece of the state, as plain data.

NUMBERS = ("step", "adam_steps", "scale", "good_steps", "lr_step", "position")
TENSORS = ("master", "m", "v", "weights", "generator", "order", "next")
# What each piece is, in the words of the feedback.
PIECES = {
    "step": "the step", "adam_steps": "Adam's step count", "scale": "the loss scale",
    "good_steps": "the loss scaler's count of good steps", "lr_step": "the learning-rate schedule",
    "position": "the data loader's position", "order": "the data loader's order of the samples",
    "generator": "the random generator's state", "master": "the master weights", "m": "Adam's m", "v": "Adam's v",
    "weights": "the float16 weights (layers)", "next": "the next batch's samples",
}


def pieces(state) -> dict:
    """Every piece of a rank's state, cloned (what the checks compare, bit for bit). Read defensively: the state
    went through the learner's load."""
    out = {}
    for name in NUMBERS:
        out[name] = _number(getattr(state, name, None))
    for name in ("master", "m", "v", "order"):
        value = getattr(state, name, None)
        out[name] = value.detach().clone() if isinstance(value, torch.Tensor) else None
    generator = getattr(state, "generator", None)
    out["generator"] = generator.get_state() if isinstance(generator, torch.Generator) else None
    try:
        out["weights"] = torch.cat([w.detach().reshape(-1) for w in flat_weights(state.layers)])
    except (TypeError, AttributeError, RuntimeError):
        out["weights"] = None
    try:
        out["next"] = next_batch(state)
    except Exception:  # an order or a generator the load left broken: the pieces themselves say what
        out["next"] = None
    return out


def _number(value):
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)


def resharded(per_rank: list[dict], world: int) -> list[dict]:
    """The pieces of an N-rank state as a `world`-rank one would hold them: the shards joined and cut again; the
    rest (the same on every rank) as rank 0 had it."""
    out = []
    joined = {name: torch.cat([p[name] for p in per_rank]) for name in ("master", "m", "v")}
    for q in range(world):
        mine = dict(per_rank[0])
        for name, whole in joined.items():
            shard = whole.numel() // world
            mine[name] = whole[q * shard:(q + 1) * shard].clone()
        out.append(mine)
    return out


def differences(got_per_rank, expected_per_rank) -> list[str]:
    """What differs, piece by piece and rank by rank, bit for bit: ['on rank 1, the loss scale is 1024.0, expected
    512.0', ...]."""
    out = []
    got_per_rank = got_per_rank if isinstance(got_per_rank, list) else []
    for r, expected in enumerate(expected_per_rank):
        got = got_per_rank[r] if r < len(got_per_rank) and isinstance(got_per_rank[r], dict) else None
        if got is None:
            out.append(f"rank {r} recorded nothing")
            continue
        for piece, what in PIECES.items():
            problem = piece_mismatch(got.get(piece), expected[piece])
            if problem:
                out.append(f"on rank {r}, {what} {problem}")
    return out


def piece_mismatch(got, expected) -> str | None:
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"is {'missing' if got is None else 'a ' + type(got).__name__}, expected a {_desc(expected)} tensor"
        if got.shape != expected.shape or got.dtype != expected.dtype:
            return f"is a {_desc(got)} tensor, expected {_desc(expected)}"
        if torch.equal(got, expected):
            return None
        same = got == expected
        if got.is_floating_point():
            same |= torch.isnan(got) & torch.isnan(expected)
        n = int((~same).sum())
        first = int((~same).reshape(-1).nonzero()[0])
        return (f"differs in {n:,} of {expected.numel():,} entries (first at {first}: "
                f"{got.reshape(-1)[first].item():.9g}, expected {expected.reshape(-1)[first].item():.9g})")
    if got != expected or type(got) is not type(expected) and not (isinstance(got, (int, float))
                                                                     and isinstance(expected, (int, float))):
        return f"is {got!r}, expected {expected!r}"
    return None


def _desc(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"
