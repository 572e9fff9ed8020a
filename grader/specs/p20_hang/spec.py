"""p20 the hang: a training step whose ranks part (a data-dependent skip, a rank-dependent loop count) and hang;
the learner finds where with the flight recorder and makes every rank make the same calls.

The rules, each measured as such: every rank's weights after each step of two runs against SGD on the serial
model (the loss averaged over the real rows of the whole batch), the loss each rank returns against that loss at
its own weights before the step (so a wrong log is told from a wrong update), and the bytes each rank sends (one
all-reduce of the gradients per step: a fix that keeps a collective per microbatch and pads the ranks' counts with
empty ones sends more). A program that still hangs fails at the job's collective timeout, with the flight
recorder's dump; a longer timeout changes when, not whether (the simulator sees the hang itself). Where the fault
sits (which rank has no real row at which step, whose microbatches are fewer) comes from the seed, and differs
between the two runs, so a fix that names a rank or a step fails the other run.
"""

from __future__ import annotations

import torch
from torch.profiler import record_function

from puzzles.sim import CostModel

from ...core.compare import TOLERANCE_TEXT, safe_diagnosis, tensor_mismatch
from ...core.result import Budget, Check
from ...core.rules import BOOKKEEPING_BYTES, communication_check, compute_check
from ...core.spec import Observation, PuzzleSpec
from . import layout as lay
from .diagnoses import diagnose_communication, diagnose_loss, diagnose_weights

COST = CostModel(latency_ticks=8, bytes_per_tick=512)  # puzzle 8's network


class Hang(PuzzleSpec):
    id, name, title = "p20", "hang", "The hang (a collective timeout)"
    entries = ("train_step",)
    world_size = lay.N
    cost = COST
    hints = ("Read the flight recorder's analysis: the collective at which the ranks part, and what each rank's "
             "last records say (the step the harness was in, the line that made the call).",
             "Every rank must make the same calls whatever its data: its share of the gradient (zeros when it has "
             "no real row), in one all-reduce per step after all its microbatches.")

    def make_inputs(self, seed):
        return lay.make_inputs(seed)

    def reference(self, inputs):
        return {name: lay.reference_run(run, inputs["lr"]) for name, run in inputs["runs"].items()}

    def launch(self, inputs):
        per_rank = []
        for r in range(lay.N):
            per_rank.append(({name: {"layers": run["layers"], "steps": [lay.shard(s, r) for s in run["steps"]]}
                              for name, run in inputs["runs"].items()},))
        return (inputs["lr"],), per_rank

    def sim_options(self, inputs):
        return {"collective_timeout": lay.TIMEOUT_TICKS}

    def program(self, module):
        step_fn = getattr(module, self.entries[0])

        def run(dist, lr, runs):
            out = {}
            for name, run_ in runs.items():
                layers = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_())
                          for w1, w2 in run_["layers"]]
                weights, losses = [], []
                for s, (x, target, valid) in enumerate(run_["steps"]):
                    for w in (w for pair in layers for w in pair):
                        w.grad = None
                    with record_function(f"run {name} step {s}"):
                        loss = step_fn(dist, x, target, valid, layers, lr)
                    weights.append([(w1.detach().clone(), w2.detach().clone()) for w1, w2 in layers])
                    losses.append(loss.detach().clone() if isinstance(loss, torch.Tensor) else loss)
                out[name] = {"weights": weights, "losses": losses}
            return out

        return run

    def budgets(self, inputs):
        return {"compute": Budget(
            "compute", f"1.5·k·12·L·d·h·r FLOPs: k = {lay.STEPS_IN_ALL} steps of a forward and backward (12·L·d·h "
            f"FLOPs a row) on the rank's own r = {lay.ROWS} rows, padding included, and half as much again",
            lay.COMPUTE_CEILING, "count"),
            "communication": Budget(
            "communication", f"k·2(N-1)/N·G + {BOOKKEEPING_BYTES:,} bytes: k = {lay.STEPS_IN_ALL} steps in all, each "
            f"one all-reduce of the gradients (G = 2·L·d·h·8 = {lay.GRADIENT_BYTES:,} bytes); 1 KiB for scalars (a "
            f"count of rows, the loss)", lay.STEPS_IN_ALL * lay.ALL_REDUCE_BYTES + BOOKKEEPING_BYTES, "bytes")}

    # ---- checks

    def check(self, obs: Observation, ref, inputs):
        res = [r if isinstance(r, dict) else {} for r in obs.results]
        return [self.check_weights(res, ref, inputs), self.check_losses(res, inputs),
                communication_check(obs, self.budgets(inputs)["communication"], diagnose=diagnose_communication),
                compute_check(obs, self.budgets(inputs)["compute"], _diagnose_compute)]

    def check_weights(self, res, ref, inputs) -> Check:
        """The first (run, step, rank, weight) that differs from the serial run, and the mistake that explains that
        step from the rank's own weights before it."""
        name = "weights after each step"
        count = 0
        for run in lay.RUNS:
            for s in range(lay.STEPS):
                for rank, r in enumerate(res):
                    got = _weights_at(r, run, s)
                    expected = ref[run]["weights"][s]
                    for i, (pair, want) in enumerate(zip(got, expected)):
                        for k, (g, e) in enumerate(zip(pair, want)):
                            count += 1
                            problem = tensor_mismatch(g, e)
                            if problem is None:
                                continue
                            before = _weights_at(r, run, s - 1) if s else inputs["runs"][run]["layers"]
                            diagnosis = safe_diagnosis(diagnose_weights, inputs, run, s, rank, before,
                                                       got) if _complete(before) and _complete(got) else ""
                            return Check(name, False, f"rank {rank}'s layers[{i}].{('w1', 'w2')[k]} after run {run} "
                                         f"step {s} {problem} (the serial step on the whole batch: SGD, lr "
                                         f"{inputs['lr']}, on the loss averaged over every rank's real rows).",
                                         diagnosis=diagnosis)
        return Check(name, True, f"every rank's weights after each of the {lay.STEPS_IN_ALL} steps match the serial "
                                 f"run ({count} tensors; {TOLERANCE_TEXT})")

    def check_losses(self, res, inputs) -> Check:
        """Each rank's returned loss against the global loss at its own weights before the step."""
        name = "logged losses"
        for run in lay.RUNS:
            steps = inputs["runs"][run]["steps"]
            for s in range(lay.STEPS):
                for rank, r in enumerate(res):
                    before = _weights_at(r, run, s - 1) if s else inputs["runs"][run]["layers"]
                    if not _complete(before):
                        continue  # the weights check says what is missing
                    expected = lay.global_loss(before, steps[s])
                    got = _loss_at(r, run, s)
                    if isinstance(got, torch.Tensor) and got.numel() == 1:
                        got = got.detach().reshape(())
                    problem = tensor_mismatch(got, expected)
                    if problem is not None:
                        return Check(name, False, f"rank {rank}'s loss at run {run} step {s} {problem}.",
                                     diagnosis=safe_diagnosis(diagnose_loss, inputs, run, s, rank, before, got))
        return Check(name, True, f"every rank's loss at each of the {lay.STEPS_IN_ALL} steps is the loss over every "
                                 f"rank's real rows at its weights before the step ({TOLERANCE_TEXT})")


def _diagnose_compute(rank: int, forward: int, backward: int) -> str:
    times = (forward + backward) / lay.SHARE_FLOPS
    return (f"rank {rank} computed {times:.1f}x a forward and backward on its own {lay.ROWS} rows at every step: "
            f"it computed other ranks' rows too (gathered their data, or replayed the whole step). The whole "
            f"batch's gradient is the sum of each rank's share: each computes its own rows' gradient (zeros for "
            f"padding) and one all-reduce adds them")


def _weights_at(r: dict, run: str, s: int) -> list:
    weights = (r.get(run) or {}).get("weights") or []
    step = weights[s] if 0 <= s < len(weights) else []
    return [pair if isinstance(pair, (list, tuple)) and len(pair) == 2 else (None, None) for pair in step] or \
        [(None, None)] * lay.L


def _loss_at(r: dict, run: str, s: int):
    losses = (r.get(run) or {}).get("losses") or []
    return losses[s] if s < len(losses) else None


def _complete(layers) -> bool:
    return len(layers) == lay.L and all(isinstance(w, torch.Tensor) and w.dtype == torch.float64
                                        for pair in layers for w in pair)


SPEC = Hang()
