"""p1 activation checkpointing: keep every k-th block's input, recompute each segment in backward.

The rules, each measured as such: output and every gradient against the serial model; what the forward left alive
(the learner's work is split in two functions so that the rank program can read it between them with
`probe.memory_now()`); the peak; and the compute, in FLOPs, between the serial forward and backward and one more
forward. The grader computes the loss and grad_y from the learner's y itself. The helpers below (reference, value
checks and their diagnoses) are shared with p2.
"""

from __future__ import annotations

import contextlib

import torch

from puzzles.model import forward, init_layers, loss_fn, make_batch
from puzzles.sim import CostModel

from ...core.compare import ratio, safe_diagnosis, values_check
from ...core.probe import memory_now
from ...core.result import Budget, Check, fmt
from ...core.rules import BOOKKEEPING_BYTES, compute_check
from ...core.spec import Observation, PuzzleSpec, pair_at
from ..common.costs import block_costs
from .checkpoint_taken_away import without_torch_checkpoint

B, D, H, L, K = 256, 32, 128, 16, 4
BYTES = 8  # float64
C = B * D * BYTES  # one [B, d] activation: a checkpoint, x, y, grad_y
A = B * (D + 2 * H) * BYTES  # what autograd saves for one block: x @ w1 and gelu(x @ w1) [B, h], the output [B, d]
W = 2 * L * D * H * BYTES  # the weights (and, as much again, their gradients)
WORKSPACE = 2 * B * H * BYTES  # the backward's temporaries: gradients of [B, h] activations
COST = CostModel()
# A block's forward and backward on the batch, every op counted (common/costs.py): F = 4·B·d·h + B·h + B·d (two matmuls,
# gelu, the residual add), its backward BK = 8·B·d·h + B·h + B·d (four matmuls, gelu's backward, the two gradients
# of its input added).
FORWARD, BACKWARD = block_costs(B, D, H, COST)
F, BK = FORWARD.flops, BACKWARD.flops
PRODUCTS = 3 * L * 4 * B * D * H  # the serial forward's and backward's matrix products: a floor on the compute
ALLOWANCE = L * B * D  # room for bookkeeping: one elementwise op on every block's [B, d] activation


# ---- the serial truth, shared with p2


def serial(x, target, layers, k):
    """Loss, output and gradients of the whole stack, and, for the diagnosis, the gradients an answer gets when it
    backpropagates grad_y into every segment instead of the gradient of that segment's own output."""
    x0 = x.detach().clone().requires_grad_()
    ws = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_()) for w1, w2 in layers]
    y = forward(x0, ws)
    loss = loss_fn(y, target)
    loss.backward()
    grads = [(w1.grad, w2.grad) for w1, w2 in ws]
    grad_y = 2 * (y.detach() - target) / y.shape[0]
    same = []
    h = x.detach()
    with torch.no_grad():
        starts, after = [], [h]  # after[j]: the stack's activation after j blocks
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                starts.append(h)
            h = forward(h, [(w1, w2)])
            after.append(h)
    for s, start in enumerate(starts):
        seg = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_())
               for w1, w2 in layers[s * k:(s + 1) * k]]
        forward(start, seg).backward(grad_y)
        same += [(w1.grad, w2.grad) for w1, w2 in seg]
    return {"y": y.detach(), "loss": loss.detach(), "grads": grads, "grad_x": x0.grad, "same_grad": same,
            "after": after}


def detached(t):
    return t.detach() if isinstance(t, torch.Tensor) else t


def grad_pairs(results, ref) -> list:
    """(label, got, expected, (rank, layer index or None, name)) for every weight's .grad and grad_x of every rank."""
    pairs = []
    for rank, res in enumerate(results):
        for i, (e1, e2) in enumerate(ref["grads"]):
            g1, g2 = pair_at(res["grads"], i)
            pairs.append((f"rank {rank}: layers[{i}].w1.grad", g1, e1, (rank, i, "w1")))
            pairs.append((f"rank {rank}: layers[{i}].w2.grad", g2, e2, (rank, i, "w2")))
        pairs.append((f"rank {rank}: grad_x (what the backward returned)", res["grad_x"], ref["grad_x"],
                      (rank, None, "grad_x")))
    return pairs


def output_check(results, ref) -> Check:
    pairs = []
    for rank, res in enumerate(results):
        pairs.append((f"rank {rank}: y (what the forward returned)", res["y"], ref["y"], rank))
        pairs.append((f"rank {rank}: loss (computed by the grader from your y)", res["loss"], ref["loss"], rank))
    return values_check("output", pairs, "outputs and losses", lambda bad: diagnose_output(bad, results, ref))


def diagnose_output(bad, results, ref) -> str:
    """A y that is the stack's activation after another number of blocks says how many blocks the forward ran."""
    y = results[bad[0].meta].get("y")
    ran = next((j for j, h in enumerate(ref["after"]) if _close(y, h)), None)
    if ran is None:
        return ""
    return (f"y is the stack's activation after {ran} blocks, not after all {len(ref['after']) - 1}: the forward "
            f"ran blocks 0 to {ran - 1} only" if ran else "y is x itself: the forward ran no block")


def _close(got, expected) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == expected.shape and got.dtype == expected.dtype
            and bool(torch.allclose(got, expected, rtol=1e-8, atol=1e-10)))


def diagnose_gradients(bad, results, ref, k, gathered: bool = False) -> str:
    """Name the likely mistake from which gradients are off and how."""
    rank = bad[0].meta[0]
    res = results[rank]
    n_layers = len(ref["grads"])
    if not _close(res.get("y"), ref["y"]):
        return ("the output is already wrong (see the output check): grad_y is computed from your y, and every "
                "gradient follows from it. Fix the forward first")
    weights_bad = [m for m in bad if m.meta[0] == rank and m.meta[1] is not None]
    if any(m.got is None for m in weights_bad):
        return ("some weights have no gradient (.grad is None): recompute every segment with autograd on "
                "(`with torch.enable_grad():`) from a checkpoint that requires grad, and call backward on each "
                "recomputed output")
    if not weights_bad:
        if res["grad_x"] is None:
            return ("every weight's gradient is right but the backward returned None: return the gradient of the "
                    "first checkpoint (the .grad of segment 0's recomputed input)")
        return "every weight's gradient is right but grad_x is not: return the gradient of segment 0's input"
    got = [g for i in range(n_layers) for g in pair_at(res["grads"], i)]
    want = [g for pair in ref["grads"] for g in pair]
    if all(_close(g, e) for g, e in zip(got, [g for pair in ref["same_grad"] for g in pair])):
        return ("every segment was backpropagated from grad_y: only the last segment's output has that gradient. "
                "Each earlier segment must start from the gradient of its own output, which is the .grad of the "
                "recomputed input of the segment after it")
    factors = {ratio(g, e) for g, e in zip(got, want) if isinstance(g, torch.Tensor)}
    if len(factors) == 1 and None not in factors:
        f = factors.pop()
        if gathered and abs(f - len(results)) < 1e-6:
            return (f"every gradient is exactly {len(results)}x the reference: did you all-reduce (sum) the gradients "
                    f"across the ranks? Every rank runs the whole stack, so its gradients are already complete")
        if abs(f - round(f)) < 1e-6 and round(f) >= 2:
            return (f"every gradient is exactly {round(f)}x the reference: gradients were accumulated "
                    f"{round(f)} times (backward ran more than once through each segment?)")
    if all(m.meta[1] < n_layers - k for m in weights_bad):
        return ("the last segment's gradients are right and earlier ones are not: the gradient handed from one "
                "segment to the one before it is wrong (it must be the .grad of the later segment's recomputed "
                "input, after that segment's backward)")
    if gathered:
        return ("the last segment's gradients are wrong too, although it is backpropagated from grad_y: the "
                "checkpoints you recompute from are not the block inputs you saved. all_gather_into_tensor "
                "concatenates rank 0's shard, then rank 1's, ... along dim 0: keep the shard `c.chunk(N)[rank]` "
                "(rows), and gather into a [B, d] tensor")
    return ("the last segment's gradients are wrong too, although it is backpropagated from grad_y: does the "
            "recompute of segment s start from the input of block s·k, and run exactly blocks s·k .. s·k+k-1?")


@contextlib.contextmanager
def explain_backward_errors():
    """Autograd's error for backpropagating through something recorded without a graph names no cause; add one."""
    try:
        yield
    except RuntimeError as exc:
        if "does not require grad" in str(exc) and hasattr(exc, "add_note"):
            exc.add_note("likely cause: the segment you backpropagate through was recomputed without a graph (under "
                         "torch.no_grad(), or from inputs that require no grad): recompute it with autograd on "
                         "(`with torch.enable_grad():`) from `checkpoint.detach().requires_grad_()`")
        raise


def gradients_check(results, ref, k, gathered: bool = False) -> Check:
    return values_check("gradients", grad_pairs(results, ref), "gradients (every weight's .grad and grad_x)",
                        lambda bad: diagnose_gradients(bad, results, ref, k, gathered))


def largest_at_peak(ledger: dict, n: int = 2) -> str:
    lines = [f"{fmt(e['bytes'], 'bytes')} from {e['site']}" for e in ledger["peak_by_line"][:n]]
    return "; ".join(lines)


def peak_check(obs: Observation, budget: Budget, hint) -> Check:
    over = [r for r in range(obs.world_size) if obs.peak_bytes[r] > budget.value]
    r = over[0] if over else max(range(obs.world_size), key=lambda q: obs.peak_bytes[q])
    who = f"rank {r}" if obs.world_size > 1 else "your code"
    ok = not over
    message = (f"{who} peaked at {fmt(obs.peak_bytes[r], 'bytes')}, {'within' if ok else 'over'} the budget "
               f"{budget.describe()}")
    if not ok:
        message += f". Largest at the peak: {largest_at_peak(obs.ledgers[r])}"
    return Check("peak memory", ok, message, measured=obs.peak_bytes[r], budget=budget,
                 diagnosis="" if ok else safe_diagnosis(hint, r))


# ---- the puzzle


def loss_and_backward(y, target, layers, backward) -> dict:
    """The grader's part between the learner's forward and backward: the loss of y, and dL/dy handed to
    `backward(grad_y) -> grad_x`; returns what the checks read (y, loss, grad_x, every weight's gradient)."""
    with torch.no_grad():
        y = detached(y)
        loss = loss_fn(y, target)
        grad_y = 2 * (y - target) / y.shape[0]
    with explain_backward_errors():
        grad_x = backward(grad_y)
    return {"y": y, "loss": loss, "grad_x": detached(grad_x),
            "grads": [(detached(w1.grad), detached(w2.grad)) for w1, w2 in layers]}


class Checkpointing(PuzzleSpec):
    id, name, title = "p1", "checkpointing", "Activation checkpointing"
    entries = ("checkpointed_forward", "checkpointed_backward")
    world_size = 1
    cost = COST
    hints = ("Forward under torch.no_grad(), keeping only every k-th block's input; backward segment by segment, "
             "last first, each recomputed with torch.enable_grad() from its checkpoint.detach().requires_grad_().",)

    def run_context(self):
        return without_torch_checkpoint()

    def make_inputs(self, seed):
        x, target = make_batch(B, D, seed)
        return {"x": x, "target": target, "layers": init_layers(L, D, H, seed + 1), "k": K}

    def reference(self, inputs):
        return serial(inputs["x"], inputs["target"], inputs["layers"], inputs["k"])

    def launch(self, inputs):
        return (inputs["x"], inputs["target"], inputs["layers"], inputs["k"]), None

    def program(self, module):
        fwd, bwd = module.checkpointed_forward, module.checkpointed_backward

        def run(dist, x, target, layers, k):
            before = memory_now()
            saved, y = forward_result(fwd(x, layers, k), "checkpointed_forward", target)
            kept = memory_now() - before
            return {**loss_and_backward(y, target, layers, lambda grad_y: bwd(saved, layers, k, grad_y)),
                    "kept": kept, "graph": built_graph(saved, y)}

        return run

    def budgets(self, inputs):
        k = inputs["k"]
        return {
            "checkpoint bytes": Budget("checkpoint bytes", f"(L/k + 1)·C + {BOOKKEEPING_BYTES:,} bytes (the L/k "
                                       "checkpoints and y; C = B·d·8; plus scalars)",
                                       (L // k + 1) * C + BOOKKEEPING_BYTES, "bytes"),
            "peak memory": Budget("peak memory", "W + G + 2·C + (L/k)·C + 2·C + k·A + 2·B·h·8 bytes "
                                  "(A = B·(d+2h)·8)", 2 * W + 2 * C + (L // k) * C + 2 * C + k * A + WORKSPACE,
                                  "bytes"),
            "compute": Budget("compute", "L·(2F + BK) + L·B·d (the serial forward and backward, L·(F + BK), plus "
                              f"one more forward; F = 4·B·d·h + B·h + B·d = {F:,} a block's forward, BK = "
                              f"8·B·d·h + B·h + B·d = {BK:,} its backward; L·B·d for bookkeeping)",
                              L * (2 * F + BK) + ALLOWANCE, "count"),
        }

    def check(self, obs: Observation, ref, inputs):
        k = inputs["k"]
        budgets = self.budgets(inputs)
        res = obs.results[0]
        checks = [output_check(obs.results, ref), gradients_check(obs.results, ref, k)]
        kept = res["kept"]
        b = budgets["checkpoint bytes"]
        ok = kept <= b.value
        checks.append(Check("checkpoint bytes", ok,
                            f"after checkpointed_forward your code still held {fmt(kept, 'bytes')} more than "
                            f"before it ({kept / C:.2f}·C), {'within' if ok else 'over'} the budget {b.describe()}",
                            measured=kept, budget=b,
                            diagnosis="" if ok else safe_diagnosis(self.diagnose_kept, kept, k, res.get("graph", True))))
        checks.append(peak_check(obs, budgets["peak memory"], lambda r: self.diagnose_peak(obs, kept, k)))
        checks.append(compute_check(obs, budgets["compute"], lambda r, fwd, bwd: self.diagnose_compute(fwd, bwd, k),
                                    least=PRODUCTS))
        return checks

    @staticmethod
    def diagnose_kept(kept, k, graph: bool = True) -> str:
        if kept >= L * C + C + A and graph:
            return (f"the forward left about {kept / A:.1f} blocks' worth of autograd activations alive "
                    f"(A = {fmt(A, 'bytes')} a block): it built the autograd graph. Run it under torch.no_grad() "
                    f"(or detach what you keep): a checkpoint that carries a grad_fn keeps the whole graph behind it")
        if kept >= (L - 1) * C + C:
            return (f"you kept every block's input ({kept / C:.0f}·C): keep only the inputs of blocks 0, k, 2k, ... "
                    f"(L/k = {L // k} of them); the others are recomputed in backward")
        return "keep only the inputs of blocks 0, k, 2k, ... and the output y; let every other tensor go"

    @staticmethod
    def diagnose_peak(obs, kept, k) -> str:
        if kept > (L // k + 1) * C + BOOKKEEPING_BYTES:
            return "the peak follows from what the forward kept (see checkpoint bytes)"
        blocks = (obs.peak_bytes[0] - (2 * W + 4 * C + (L // k) * C)) / A
        return (f"about {blocks:.0f} blocks' activations were alive at once, although the forward kept only the "
                f"checkpoints: recompute one segment at a time, right before backpropagating through it, and let "
                f"its graph and output go before recomputing the next")

    @staticmethod
    def diagnose_compute(fwd, bwd, k) -> str:
        """From the forward FLOPs outside backward (the forward and the recomputations) and those inside it."""
        if bwd > L * BK + ALLOWANCE:
            return (f"the backward ran {bwd / BK:.0f} blocks' backwards for {L} blocks: some segment was "
                    f"backpropagated more than once")
        blocks = round((fwd - L * F) / F)
        quadratic = k * (L // k) * (L // k + 1) // 2
        if blocks == quadratic:
            return (f"you recomputed {blocks} blocks instead of {L}: each segment was recomputed from the stack's "
                    f"input instead of from its own checkpoint")
        return (f"besides the forward, you ran {blocks} blocks' forwards; checkpointing recomputes each block once "
                f"({L} blocks)")


def built_graph(saved, y) -> bool:
    """Whether the forward's output, or a checkpoint it kept, carries an autograd graph: the evidence for "it built
    the autograd graph" (memory alone cannot tell a graph from checkpoints kept in a costlier form)."""
    kept = [y, *(saved if isinstance(saved, (list, tuple)) else [saved])]
    return any(isinstance(t, torch.Tensor) and t.grad_fn is not None for t in kept)


def forward_result(result, name: str, target):
    """The (saved, y) a forward returned, or an error that says what it returned instead."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError(f"{name} must return a pair (saved, y); it returned {type(result).__name__}"
                        + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else ""))
    saved, y = result
    if not isinstance(y, torch.Tensor) or y.shape != target.shape:
        got = f"shape {list(y.shape)}" if isinstance(y, torch.Tensor) else type(y).__name__
        raise TypeError(f"{name} must return y, the stack's output [{target.shape[0]}, {target.shape[1]}], as the "
                        f"second item of (saved, y); it returned {got}")
    return saved, y


SPEC = Checkpointing()
