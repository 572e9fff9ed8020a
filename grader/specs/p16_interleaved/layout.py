"""p16's layout: 8 one-block stages on 4 ranks, v = 2 chunks each (rank r holds stages r and r + p), the interleaved
order, the serial reference cut at every stage boundary, and what wrong gradients say about the mistake.

    stage s = c·p + r        chunk c of rank r (block s of the model)
    forward j of a rank      chunk (j // p) % v of microbatch (j // (p·v))·p + j % p (groups of p microbatches)
    backward j               the same microbatch, chunk v - 1 - (j // p) % v

A likely cause is named only when the evidence singles it out (a common factor the FLOPs explain, the two chunks'
input gradients swapped, a permutation of the microbatches' rows, weight gradients that hold one microbatch's
contribution only); otherwise the diagnosis says where the first wrong stage is. Whatever a rank returned, this
module only reads it.
"""

from __future__ import annotations

import torch

from puzzles.model import forward, loss_fn

from ...core.compare import ratio, tensor_mismatch
from ...core.spec import Observation, pair_at
from ..common.costs import ZERO, Cost, block_costs, loss_costs
from ..common.pipeline_values import COST, B, D, H, M, MB, close, diagnose_factor, match_chunks, wrong_slot

P, V = 4, 2
STAGES = P * V  # one block each
L = STAGES
# One chunk (one block) on one microbatch, every op counted (common/costs.py): forward 2 matmuls, a gelu, a residual add;
# backward 4 matmuls, gelu's backward, the input gradients' add and the 2 weight gradients added into w.grad.
CHUNK_FORWARD, CHUNK_BACKWARD = block_costs(MB, D, H, COST, input_grad=True, accumulate=True)
LOSS_FORWARD, LOSS_BACKWARD = loss_costs(MB, D, COST, divide_by=M)
PRODUCTS = 6 * 2 * MB * D * H  # one chunk's matmuls on one microbatch: 2 forward, 4 backward
ALLOWANCE = M * MB * D  # bookkeeping: one elementwise op on each microbatch's [mb, d] gradient
CHUNK_ACT = (2 * MB * H + MB * D) * 8  # one microbatch's activations in one chunk: x@w1, its gelu, the output
MESSAGE = MB * D * 8  # one microbatch's activation (or gradient) between stages


def rank_work(rank: int) -> Cost:
    """Everything `rank` computes in a step: every microbatch through both its chunks, forward and backward, and
    the loss on the rank that holds the last stage."""
    loss = M * (LOSS_FORWARD + LOSS_BACKWARD) if rank == P - 1 else ZERO
    return M * V * (CHUNK_FORWARD + CHUNK_BACKWARD) + loss


WORK = [rank_work(r) for r in range(P)]


def stage(rank: int, chunk: int) -> int:
    return chunk * P + rank


def forward_unit(j: int) -> tuple[int, int]:
    """(chunk, microbatch) of a rank's j-th forward in the interleaved order."""
    group, k = divmod(j, P * V)
    return k // P, group * P + k % P


def warmup(rank: int) -> int:
    """Megatron-LM's warm-up forwards of the interleaved 1F1B: (p - rank - 1)·2 + (v - 1)·p."""
    return min((P - rank - 1) * 2 + (V - 1) * P, M * V)


def most_in_flight(rank: int) -> int:
    """The chunk activations the interleaved order holds on `rank` at most: its warm-up forwards and one more."""
    return min(warmup(rank) + 1, M * V)


def messages_sent(rank: int) -> int:
    """Activations and gradients `rank` sends: one per microbatch per chunk each way, but none of the gradient of
    stage 0's input (the batch) and none of the last stage's output (the loss)."""
    activations = sum(M for c in range(V) if stage(rank, c) != STAGES - 1)
    gradients = sum(M for c in range(V) if stage(rank, c) != 0)
    return activations + gradients


def one_f_one_b_messages(rank: int) -> int:
    """The same count for puzzle 6's 1F1B (one stage per rank): an activation and a gradient per microbatch, less
    the two ends."""
    return (M if rank != P - 1 else 0) + (M if rank != 0 else 0)


def serial(inputs) -> dict:
    """The serial step cut at every stage boundary: each stage's input and its gradient (whole batch), and every
    block's weight gradient."""
    layers = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_())
              for w1, w2 in inputs["layers"]]
    acts, outs = [], []
    a = inputs["x"].detach().clone()
    for s in range(STAGES):
        a = a.detach().requires_grad_()
        acts.append(a)
        a = forward(a, [layers[s]])
        outs.append(a)
    loss = loss_fn(outs[-1], inputs["target"])
    loss.backward()
    for s in reversed(range(STAGES - 1)):
        outs[s].backward(acts[s + 1].grad)
    return {"grads": [(w1.grad, w2.grad) for w1, w2 in layers], "acts": [a.detach() for a in acts],
            "input_grads": [a.grad for a in acts], "loss": loss.item()}


def chunk_grads(res, c: int) -> tuple:
    """(w1.grad, w2.grad) of chunk c's block, as a rank handed them back (never trusted to have the structure)."""
    chunks = res.get("grads") if isinstance(res, dict) else None
    chunk = chunks[c] if isinstance(chunks, (list, tuple)) and c < len(chunks) else None
    return pair_at(chunk, 0)


def returned_input_grad(res, c: int):
    got = res.get("input_grads") if isinstance(res, dict) else None
    return got[c] if isinstance(got, (list, tuple)) and c < len(got) else None


def value_pairs(obs: Observation, ref) -> tuple[list, list]:
    """(label, got, expected, (rank, chunk, "w1" | "w2" | "input")) for every chunk's weight gradients and every
    returned input gradient."""
    grad_pairs, input_pairs = [], []
    for r, res in enumerate(obs.results):
        for c in range(V):
            s = stage(r, c)
            w1, w2 = chunk_grads(res, c)
            for which, g, e in (("w1", w1, ref["grads"][s][0]), ("w2", w2, ref["grads"][s][1])):
                grad_pairs.append((f"rank {r}: chunks[{c}][0].{which}.grad (stage {s}, block {s})", g, e,
                                   (r, c, which)))
            what = "dL/dx" if s == 0 else f"dL/d(stage {s} input)"
            input_pairs.append((f"rank {r}: the returned input gradient of chunk {c} ({what})",
                                returned_input_grad(res, c), ref["input_grads"][s], (r, c, "input")))
    return grad_pairs, input_pairs


CONTRACT = (f"a list of v = {V} float64 tensors [{B}, {D}], dL/d(chunk 0's input) and dL/d(chunk 1's input), "
            f"microbatch i in rows {MB}i to {MB}i+{MB - 1}")


def diagnose_values(obs: Observation, ref, inputs, grad_pairs, input_pairs) -> str:
    bad = [(meta, got, expected) for _, got, expected, meta in grad_pairs + input_pairs
           if tensor_mismatch(got, expected) is not None]
    if not bad:
        return ""
    returned = [res.get("input_grads") if isinstance(res, dict) else None for res in obs.results]
    for r, got in enumerate(returned):
        if not isinstance(got, (list, tuple)) or len(got) != V:
            return f"rank {r} returned {type(got).__name__ if got is not None else 'None'}; the step returns {CONTRACT}"
    swapped = [r for r, got in enumerate(returned)
               if close(got[0], ref["input_grads"][stage(r, 1)]) and close(got[1], ref["input_grads"][stage(r, 0)])]
    if swapped:
        return (f"rank {swapped[0]} returned its chunks' input gradients in the wrong order: the first is chunk 1's "
                f"(stage {stage(swapped[0], 1)}), the second chunk 0's. Return [chunk 0's, chunk 1's]")
    malformed = next(((meta, got) for meta, got, e in bad if not isinstance(got, torch.Tensor)
                      or got.shape != e.shape or got.dtype != e.dtype), None)
    if malformed is not None:
        (r, c, which), got = malformed
        if which == "input":
            return f"rank {r} returned something other than {CONTRACT} for chunk {c} (see the message)"
        return (f"rank {r}'s chunks[{c}][0].{which}.grad is {'None' if got is None else 'not a tensor of its shape'}"
                f" after the step: the grader hands every weight a zero .grad and backward adds into it")
    factors = [ratio(got, e) for _, got, e in bad]  # one factor for every wrong tensor: the loss's scale, or repeats
    if None not in factors and max(factors) - min(factors) < 1e-6 * max(1.0, abs(factors[0])):
        return diagnose_factor(factors[0], obs)
    return diagnose_stage(bad, ref, inputs, obs)


def diagnose_stage(bad, ref, inputs, obs) -> str:
    """The last stage that is off: every stage after it is right, so its mistake is its own."""
    top = max(bad, key=lambda b: stage(b[0][0], b[0][1]))
    r, c, _ = top[0]
    s = stage(r, c)
    res = obs.results[r]
    last = s == STAGES - 1
    block = inputs["layers"][s]
    a = ref["acts"][s].chunk(M)
    g = [None] * M if last else ref["input_grads"][s + 1].chunk(M)
    targets = inputs["target"].chunk(M) if last else [None] * M
    inputs_off = any(meta == (r, c, "input") for meta, _, _ in bad)
    if inputs_off:
        got = returned_input_grad(res, c).chunk(M)
        perm = match_chunks(got, ref["input_grads"][s].chunk(M))
        if perm is not None and perm != list(range(M)):
            return wrong_slot(r, perm) + f" (chunk {c})"
        if not last:
            pairing = [next((j for j in range(M) if close(unit_grads(block, a[i], g[j])[0], got[i])), None)
                       for i in range(M)]
            if None not in pairing and pairing != list(range(M)):
                i = next(i for i, j in enumerate(pairing) if i != j)
                return (f"gradient received for the wrong microbatch: rank {r}'s chunk {c} (stage {s}) "
                        f"backpropagated microbatch {pairing[i]}'s gradient through microbatch {i}'s activations. "
                        f"Every rank runs its backwards in the same order, the interleaved one: groups of p "
                        f"microbatches, chunk 1 before chunk 0")
    else:
        got = chunk_grads(res, c)
        for i in range(M):
            one = unit_grads(block, a[i], g[i], targets[i])[1]
            if all(close(got[k], one[k]) for k in range(2)):
                return (f"rank {r}'s chunk {c} (stage {s}) has the right input gradients, but its weight gradients "
                        f"hold microbatch {i}'s contribution only: w.grad was overwritten (or zeroed) instead of "
                        f"accumulating over the {M} microbatches")
    return (f"stage {s} (rank {r}'s chunk {c}) is the last stage that is off (the stages after it are right): its "
            f"own forward or backward of some microbatch went wrong. Does each gradient it receives go through the "
            f"graph of the same microbatch and chunk, and do its w.grad accumulate over all {M} microbatches?")


def unit_grads(block, a, g=None, target=None):
    """(gradient of the stage input, (w1 grad, w2 grad)) of one one-block stage on one microbatch's rows."""
    w1, w2 = (w.detach().requires_grad_() for w in block)
    a = a.detach().requires_grad_()
    y = forward(a, [(w1, w2)])
    if target is not None:
        grads = torch.autograd.grad(loss_fn(y, target) / M, [a, w1, w2])
    else:
        grads = torch.autograd.grad(y, [a, w1, w2], g)
    return grads[0], (grads[1], grads[2])
