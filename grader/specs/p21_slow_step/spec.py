"""p21 the slow step: a data-parallel run about twice over its time budget. Three causes, each one the issue's
(host syncs such as .item(), a synchronous all-reduce, a loader that does not overlap); the learner finds them in
the trace and removes them.

The rules, each measured as such: every rank's weights after the run and the losses it returns against the serial
run (so a fix that stops logging, or logs something else, fails); no host sync anywhere in the run (the rule
torch.cuda.set_sync_debug_mode("error") enforces: a fix that keeps a sync and hides its cost elsewhere fails here,
whatever its time); the bytes each rank sends (each step's gradients once); and the makespan against a formula of
the model's compute, one block's exposed all-reduce and the first batch's load. A makespan over budget is
explained from the trace's own figures: the batches the host loaded itself, the ticks the loop waited for data,
the syncs, and the communication the compute stream waited for.
"""

from __future__ import annotations

import torch

from puzzles.sim import CostModel, HostProfile, TensorDataset

from ...core.compare import TOLERANCE_TEXT, safe_diagnosis, tensor_mismatch
from ...core.result import Budget, Check, fmt
from ...core.rules import BOOKKEEPING_BYTES, communication_check, idle_work
from ...core.spec import Observation, PuzzleSpec
from . import layout as lay

COST = CostModel(latency_ticks=8, bytes_per_tick=512)  # puzzle 7's network
HOST = HostProfile()  # 8 ticks a launch, 40 a sync's copy back


class SlowStep(PuzzleSpec):
    id, name, title = "p21", "slow_step", "The slow step (syncs, a synchronous all-reduce, the loader)"
    entries = ("train",)
    world_size = lay.N
    cost = COST
    simulator_only = ("no host sync", "overlap", "makespan")
    hints = ("Open the trace (--trace p21.json, in Perfetto): where the compute track is empty, the host track says "
             "what the host was doing instead (a sync and its line, a batch it loaded itself), and the "
             "communication track what the device waited for.",
             "Keep the losses on the device until the end; let DataLoader workers load ahead; launch each "
             "gradient's all-reduce from a post-accumulate-grad hook with async_op=True (puzzle 7).")

    def make_inputs(self, seed):
        return lay.make_inputs(seed)

    def reference(self, inputs):
        return lay.reference_run(inputs)

    def launch(self, inputs):
        return (inputs["lr"],), [(*lay.rows_of(inputs, r), inputs["layers"]) for r in range(lay.N)]

    def sim_options(self, inputs):
        return {"host": HOST}

    def program(self, module):
        train = getattr(module, self.entries[0])

        def run(dist, lr, x, target, layers):
            layers = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_())
                      for w1, w2 in layers]
            dataset = TensorDataset(x, target, ticks_per_sample=lay.TAU)
            losses = train(dist, dataset, layers, lr)
            return {"weights": [(w1.detach().clone(), w2.detach().clone()) for w1, w2 in layers],
                    "losses": losses.detach().clone() if isinstance(losses, torch.Tensor) else losses,
                    "loaded": (dataset.samples_loaded, dataset.ticks_per_sample)}

        return run

    def budgets(self, inputs):
        return {
            "communication": Budget(
                "communication", f"S·2(N-1)/N·G + {BOOKKEEPING_BYTES:,} bytes: S = {lay.STEPS} steps, each one "
                f"all-reduce of the gradients (G = 2·L·d·h·8 = {lay.GRADIENT_BYTES:,} bytes); 1 KiB for scalars",
                lay.STEPS * lay.ALL_REDUCE_BYTES + BOOKKEEPING_BYTES, "bytes"),
            "overlap": Budget(
                "overlap", f"S·2A: S = {lay.STEPS} steps, in each at most two blocks' all-reduces A = {lay.A} left "
                f"with nothing under them (the last block's gradients are written last)", lay.OVERLAP_BUDGET,
                "ticks"),
            "makespan": Budget(
                "makespan", f"b·τ + S·(C + A) + T: the first batch's load b·τ = {lay.FIRST_LOAD:,}, S = {lay.STEPS} "
                f"steps of compute C = FB + U = {lay.FB:,} + {lay.U:,} = {lay.C:,} and one block's all-reduce A = "
                f"{lay.A} left exposed, T = 5% of S·C = {lay.TOLERANCE:,}", lay.MAKESPAN_BUDGET, "ticks")}

    # ---- checks

    def check(self, obs: Observation, ref, inputs):
        res = [r if isinstance(r, dict) else {} for r in obs.results]
        budgets = self.budgets(inputs)
        return [self.check_weights(res, ref), self.check_losses(res, ref), self.check_loading(res),
                self.check_syncs(obs), communication_check(obs, budgets["communication"]),
                self.check_overlap(obs, budgets["overlap"]), self.check_makespan(obs, budgets["makespan"])]

    def check_loading(self, res) -> Check:
        name = "data loaded"
        want = lay.STEPS * lay.B
        for rank, r in enumerate(res):
            read, ticks = r.get("loaded") or (0, lay.TAU)
            if ticks != lay.TAU:
                return Check(name, False, f"rank {rank}'s dataset took {ticks:,} ticks a sample to load where the "
                             f"data takes {lay.TAU:,}: how long loading takes is the data's, not the answer's.")
            if read < want:
                return Check(name, False, f"rank {rank} loaded {read} of its {want} samples through its dataset "
                             f"(the rest it took some other way, such as dataset.tensors, which a real job cannot: "
                             f"its samples come from disk and must be decoded, {lay.TAU:,} ticks each).",
                             diagnosis="Iterate over a DataLoader of the dataset you are given (its workers load "
                                       "the batches in the background), not over its tensors.")
        return Check(name, True, f"every rank loaded its {want} samples through its dataset ({lay.TAU:,} ticks "
                                 f"each, by the host or a worker)")

    def check_overlap(self, obs: Observation, budget: Budget) -> Check:
        exposed = {r: _exposed_communication(obs, r) + idle_work(obs, r, COST.device)[0]
                   for r in range(obs.world_size)}
        rank = max(exposed, key=exposed.get)
        ok = exposed[rank] <= budget.value
        message = (f"rank {rank}'s compute stream ran nothing (or only copies) for {fmt(exposed[rank], 'ticks')} "
                   f"of its communication, {'within' if ok else 'over'} the budget {budget.describe()}")
        diagnosis = "" if ok else (
            "The gradients' all-reduces ran while the device had nothing else to do: issue each one during "
            "backward, as soon as its gradient is written (register_post_accumulate_grad_hook, async_op=True), "
            "and wait for them only before the update, so that they run under the rest of backward (puzzle 7).")
        return Check("overlap", ok, message, measured=exposed[rank], budget=budget, diagnosis=diagnosis)

    def check_weights(self, res, ref) -> Check:
        name = "weights"
        for rank, r in enumerate(res):
            got = r.get("weights") or []
            for i, want in enumerate(ref["weights"]):
                pair = got[i] if i < len(got) and isinstance(got[i], (list, tuple)) and len(got[i]) == 2 else \
                    (None, None)
                for k, (g, e) in enumerate(zip(pair, want)):
                    problem = tensor_mismatch(g, e)
                    if problem is not None:
                        return Check(name, False, f"rank {rank}'s layers[{i}].{('w1', 'w2')[k]} after the "
                                     f"{lay.STEPS} steps {problem} (the serial run: SGD, lr {lay.LR}, on the loss "
                                     f"of each step's whole batch).", diagnosis=_weights_diagnosis(g, e))
        return Check(name, True, f"every rank's weights after the {lay.STEPS} steps match the serial run "
                                 f"({TOLERANCE_TEXT})")

    def check_losses(self, res, ref) -> Check:
        name = "logged losses"
        for rank, r in enumerate(res):
            got = r.get("losses")
            problem = tensor_mismatch(got, ref["losses"])
            if problem is not None:
                return Check(name, False, f"rank {rank}'s logged losses (what train returns) {problem} (the "
                             f"serial run's loss of each step's whole batch, at the weights before the step).",
                             diagnosis=safe_diagnosis(_losses_diagnosis, got, ref["losses"],
                                                      ref["own_losses"][rank]))
        return Check(name, True, f"every rank returns the {lay.STEPS} steps' losses of the whole batch "
                                 f"({TOLERANCE_TEXT})")

    def check_syncs(self, obs: Observation) -> Check:
        name = "no host sync"
        for rank in range(obs.world_size):
            syncs = obs.events_of(rank, "host", "sync")
            if syncs:
                sites = {}
                for e in syncs:
                    key = f"{e.get('op') or 'a sync'} at {e.get('site') or 'an unknown line'}"
                    sites[key] = sites.get(key, 0) + 1
                waited = sum(e["end"] - e["start"] for e in syncs)
                listed = "; ".join(f"{k} (x{n})" for k, n in sites.items())
                times = "once" if len(syncs) == 1 else f"{len(syncs)} times"
                return Check(name, False, f"rank {rank}'s host waited for the device {times}, "
                             f"{waited:,} ticks in all: {listed}.", diagnosis=(
                                 "A number read from a tensor (.item(), float(t), .tolist(), print) makes the host "
                                 "wait until the device has finished everything queued; meanwhile it launches "
                                 "nothing and loads nothing, so the device then waits for it. Keep such values "
                                 "as tensors on the device and return them as a tensor (train reads no number "
                                 "from the device, in the loop or after it)."))
        return Check(name, True, "no rank's host waited for its device (no .item(), .tolist(), printing, x[mask]: "
                                 "torch.cuda.set_sync_debug_mode(\"error\") would raise nowhere)")

    def check_makespan(self, obs: Observation, budget: Budget) -> Check:
        ok = obs.makespan <= budget.value
        message = f"the run took {fmt(obs.makespan, 'ticks')}, {'within' if ok else 'over'} the budget " \
                  f"{budget.describe()}"
        diagnosis = "" if ok else safe_diagnosis(_slow_diagnosis, obs)
        return Check("makespan", ok, message, measured=obs.makespan, budget=budget, diagnosis=diagnosis)


# ---- diagnoses


def _weights_diagnosis(got, expected) -> str:
    if isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor) and got.shape == expected.shape:
        return ""
    return "train must update `layers` in place (w -= lr * grad under torch.no_grad()), every weight of every block."


def _losses_diagnosis(got, expected, own) -> str:
    if not isinstance(got, torch.Tensor):
        return f"train returns {type(got).__name__}: return the {lay.STEPS} losses as one tensor (torch.stack)."
    if got.shape != expected.shape:
        return f"train returned a tensor of shape {list(got.shape)}: one loss per step, shape [{lay.STEPS}]."
    if got.dtype != expected.dtype or torch.allclose(got.double(), expected, rtol=1e-4):
        return (f"the losses are right to {float(((got.double() - expected).abs() / expected.abs()).max()):.1e} "
                f"but rounded ({got.dtype}, or computed in float32 on the way): compute and log them in float64, "
                f"the weights' dtype.")
    if torch.allclose(got, own, rtol=1e-8):
        return "each loss is this rank's own (its 8 rows): all-reduce the losses (once, after the loop) and divide by N."
    if torch.allclose(got * lay.N, expected, rtol=1e-8):
        return "each loss is the ranks' mean divided by N once more."
    if torch.allclose(got, expected * lay.N, rtol=1e-8):
        return "each loss is the ranks' sum: divide the all-reduced losses by the world size."
    return ""


def _idle_during(obs: Observation, rank: int, events: list[dict]) -> int:
    """Ticks of these events during which the rank's device did nothing, neither computing nor communicating (a
    host that waits while the device is busy costs nothing; a device that waits for a message is the
    communication's, counted there)."""
    merged: list[list[int]] = []
    for a, b in sorted((e["start"], e["end"]) for e in obs.events_of(rank, "compute") + obs.events_of(rank, "comm")):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    idle = 0
    for e in events:
        covered = sum(max(0, min(e["end"], b) - max(e["start"], a)) for a, b in merged)
        idle += (e["end"] - e["start"]) - covered
    return idle


def _exposed_communication(obs: Observation, rank: int) -> int:
    """Ticks of the rank's communication during which its compute stream ran nothing."""
    busy = sorted((e["start"], e["end"]) for e in obs.events_of(rank, "compute"))
    exposed = 0
    for c in obs.events_of(rank, "comm"):
        start, end = c["start"], c["end"]
        covered = sum(max(0, min(end, b) - max(start, a)) for a, b in busy)
        exposed += (end - start) - covered
    return exposed


def _slow_diagnosis(obs: Observation) -> str:
    """Where the time went, on the slowest rank, in the trace's own figures."""
    rank = max(range(obs.world_size), key=lambda r: max((e["end"] for e in obs.events if e["rank"] == r),
                                                         default=0))
    said = []
    loads = obs.events_of(rank, "host", "load")
    if loads:
        said.append(f"the host loaded {len(loads)} batches itself ({sum(e['end'] - e['start'] for e in loads):,} "
                    f"ticks, num_workers=0), launching nothing meanwhile: give the DataLoader workers")
    waited = _idle_during(obs, rank, obs.events_of(rank, "host", "wait for data"))
    if waited > lay.FIRST_LOAD + lay.STEPS * lay.A:  # the first batch's wait is everyone's
        said.append(f"the loop waited for batches the workers had not loaded yet while the device sat idle, "
                    f"{waited:,} ticks (a batch takes {lay.FIRST_LOAD:,} ticks of one worker, more than a step's "
                    f"{lay.C:,} of compute): more workers")
    syncs = obs.events_of(rank, "host", "sync")
    if syncs:
        said.append(f"{len(syncs)} host syncs ({syncs[0].get('site') or 'see the host track'}): each drains the "
                    f"device's queue")
    exposed = _exposed_communication(obs, rank)
    if exposed > lay.STEPS * lay.A:
        said.append(f"the compute stream sat idle for {exposed:,} ticks of communication: all-reduces issued after "
                    f"the whole backward; launch each from a post-accumulate-grad hook with async_op=True")
    if not said:
        return ""
    return f"On rank {rank}: " + "; ".join(said) + "."


SPEC = SlowStep()
