"""p19 numerics under sharding: global gradient clipping and non-finite steps, on ZeRO-2 shards of a model split
across a tensor-parallel pair (4 ranks: 2 replicas x 2 tensor-parallel ranks).

The learner writes the optimizer: reduce-scatter the gradients, the global norm from every rank's share of the
squares (each parameter counted once: the replicated ones not once per copy), clip_grad_norm_'s coefficient, Adam on
the shard, all-gather; and when any rank's gradient holds an inf or a NaN, every rank skips the step alike. The
harness runs the forward and backward (clipping_harness.py), writes the faults into one rank's gradient
(clipping_layout.FAULTS), and a second, shorter run on a fresh optimizer with its fault at another step and rank.

The rules, each measured as such: every rank's weights after each step against clip_grad_norm_ and torch.optim.Adam
on the serial model; the norm step() reports against the serial norm at the answer's own weights (so that a norm is
judged on its own, not on the weights before it), and not finite at a faulty step; at every faulty step nothing
any rank's optimizer keeps changes (the weights, Adam's state); the bytes the optimizer sends (the gradient
reduction and a few scalars: the harness's own all-reduces are not counted); and the optimizer state a rank keeps
(its 1/D of Adam's).
"""

from __future__ import annotations

import math

import torch

from puzzles.model import loss_fn
from puzzles.sim import CostModel

from ..core import probe
from ..core.compare import safe_diagnosis, tensor_mismatch
from ..core.result import Budget, Check, fmt
from ..core.rules import BOOKKEEPING_BYTES, communication_check, sized_like
from ..core.spec import Observation, PuzzleSpec
from . import clipping_layout as lay
from .clipping_harness import as_number, inject, make_groups, pair_forward, record
from .clipping_layout import D, FAULTS, K_STEPS, N, PARAM_NAMES, PROBE_FAULTS, PSI_RANK, SHARD, T, F64
from .optimizer_state import changes, snapshot, state_tensors

COST = CostModel(latency_ticks=8, bytes_per_tick=512)
STEPS_IN_ALL = K_STEPS + lay.PROBE_STEPS  # step() calls, both runs
REDUCTION = 2 * (D - 1) * F64 * PSI_RANK // D  # per step: a reduce-scatter of the gradients and an all-gather
STATE_BYTES_PER_ELEMENT = 3 * F64 + 1  # master, m, v in float64, and a byte for a mask of the replicated ones
TOL = 1e-8


def _pairs_of(weights):
    return weights if isinstance(weights, list) else []


class GlobalClipping(PuzzleSpec):
    id, name, title = "p19", "global_clipping", "Global gradient clipping and non-finite steps"
    entries = ("ClippedShardedAdam",)
    world_size = N
    cost = COST
    hints = ("Each rank adds the squares of its own shard (a replicated parameter's divided by the size of the "
             "tensor-parallel group), one all-reduce sums them: every rank then holds the same norm, and the "
             "same inf or NaN.",)

    def make_inputs(self, seed):
        return lay.make_inputs(seed)

    def reference(self, inputs):
        main = lay.torch_reference(inputs["params"], inputs["batches"], lay.skipped_steps(FAULTS))
        second = lay.torch_reference(inputs["params"], lay.probe_batches(inputs["batches"]),
                                     lay.skipped_steps(PROBE_FAULTS))
        return {"main": main, "probe": second}

    def launch(self, inputs):
        per_rank = []
        for r in range(N):
            dp, _ = lay.coords(r)
            params = [p.requires_grad_() for p in lay.rank_params(inputs["params"], r)]
            xs = [x[lay.rows(dp)] for x, _ in inputs["batches"]]
            targets = [t[lay.rows(dp)] for _, t in inputs["batches"]]
            per_rank.append((params, xs, targets))
        replicated = [lay.REPLICATED[name.split(".")[-1]] for name in PARAM_NAMES]
        return (replicated,), per_rank

    def program(self, module):
        optimizer = module.ClippedShardedAdam

        def run(dist, replicated, params, xs, targets):
            tp_group, dp_group = make_groups(dist)
            initial = [p.detach().clone() for p in params]  # the second run's start (before the state is measured)
            before = probe.memory_now()
            opt = optimizer(dist, params, list(replicated), tp_group, dp_group, lay.LR, lay.BETAS, lay.EPS,
                            lay.MAX_NORM)
            out = steps(dist, opt, params, xs, targets, FAULTS, tp_group, before)
            out["kept"] = kept_state(opt, params)
            del opt
            fresh = [p.requires_grad_() for p in initial]
            del initial
            opt = optimizer(dist, fresh, list(replicated), tp_group, dp_group, lay.LR, lay.BETAS, lay.EPS,
                            lay.MAX_NORM)
            out["probe"] = steps(dist, opt, fresh, xs[:lay.PROBE_STEPS], targets[:lay.PROBE_STEPS], PROBE_FAULTS,
                                 tp_group, None)
            return out

        return run

    def budgets(self, inputs):
        return {
            "communication": Budget(
                "communication", f"k·2(D-1)/D·8·Ψ_r + {BOOKKEEPING_BYTES:,} bytes, k = {STEPS_IN_ALL} steps in all "
                f"(a reduce-scatter of the gradients and an all-gather of the weights per step, Ψ_r = {PSI_RANK:,} "
                f"parameters per rank; 1 KiB for the scalars: the sums of squares, a flag)",
                STEPS_IN_ALL * REDUCTION + BOOKKEEPING_BYTES, "bytes"),
            "optimizer state": Budget(
                "optimizer state", f"(8 + 8 + 8 + 1)·Ψ_r/D + {BOOKKEEPING_BYTES:,} bytes (master, m and v in float64 "
                f"for the rank's 1/D shard, a byte per element for a mask of the replicated ones; scalars)",
                STATE_BYTES_PER_ELEMENT * SHARD + BOOKKEEPING_BYTES, "bytes"),
        }

    # ---- checks

    def check(self, obs: Observation, ref, inputs):
        res = [r if isinstance(r, dict) else {} for r in obs.results]
        budgets = self.budgets(inputs)
        norms = self.check_norms(res, inputs)
        skips = self.check_skips(res)
        weights = self.check_weights(res, ref, inputs, norms, skips)
        learner = Observation(obs.results, obs.peak_bytes, obs.ledgers,
                              [e for e in obs.events if not str(e.get("site", "")).startswith("[harness]")],
                              obs.makespan, obs.warnings, obs.backend)
        return [weights, norms, skips,
                communication_check(learner, budgets["communication"], diagnose=diagnose_communication),
                self.check_state(res, budgets["optimizer state"])]

    def check_weights(self, res, ref, inputs, norms: Check, skips: Check) -> Check:
        name = "weights after each step"
        expected = ref["main"]["weights"]
        for step in range(1, K_STEPS + 1):
            bad = []
            for r in range(N):
                got = _pairs_of(res[r].get("weights"))
                mine = got[step - 1] if step - 1 < len(got) else None
                for i, pname in enumerate(PARAM_NAMES):
                    want = lay.rank_slice(pname, expected[step - 1][pname], r)
                    have = mine[i] if isinstance(mine, list) and i < len(mine) else None
                    problem = tensor_mismatch(have, want)
                    if problem:
                        bad.append((r, f"rank {r}'s {pname}{_slice_text(pname, r)}", problem))
            if bad:
                before = f"steps 1 to {step - 1} matched; " if step > 1 else ""
                also = ", ".join(label for _, label, _ in bad[1:4])
                message = (f"the weights after step {step} of {K_STEPS} differ from clip_grad_norm_ and Adam on the "
                           f"serial model ({before}{len(bad)} tensors off, float64, tolerance 1e-8 x max(1, largest "
                           f"|expected|)). First: {bad[0][1]} {bad[0][2]}." + (f" Also off: {also}." if also else ""))
                diagnosis = safe_diagnosis(self.diagnose_weights, res, inputs, step, bad, norms, skips)
                return Check(name, False, message, diagnosis=diagnosis)
        return Check(name, True, f"every rank's weights after each of the {K_STEPS} steps match clip_grad_norm_ and "
                                 f"torch.optim.Adam on the serial model (float64, tolerance 1e-8 x max(1, largest "
                                 f"|expected|)), steps {' and '.join(str(s) for s in sorted(lay.skipped_steps(FAULTS)))}"
                                 f" skipped")

    def diagnose_weights(self, res, inputs, step, bad, norms: Check, skips: Check) -> str:
        if step in lay.skipped_steps(FAULTS) and not skips.passed:
            return "follows from the faulty step (see the skipped steps check)"
        if not norms.passed:
            return ("follows from the norm (see the global norm check): the clipping coefficient max_norm / (norm + "
                    "1e-6) is computed from it")
        ranks = sorted({r for r, _, _ in bad})
        if len(ranks) < N:
            return (f"only rank(s) {', '.join(map(str, ranks))} are off: the ranks went apart at step {step}. Every "
                    f"rank must clip with the same coefficient and update its own shard")
        got = res[ranks[0]].get("weights")
        for knobs, text in REPLAYED:
            replayed = lay.replay(inputs["params"], inputs["batches"], lay.skipped_steps(FAULTS), **knobs)
            if all(tensor_mismatch(got[s - 1][i], lay.rank_slice(p, replayed[s - 1][p], ranks[0])) is None
                   for s in range(1, step + 1) for i, p in enumerate(PARAM_NAMES)):
                return text
        return ""

    def check_norms(self, res, inputs) -> Check:
        name = "global norm"
        for run, faults, batches in (("main", FAULTS, inputs["batches"]),
                                     ("probe", PROBE_FAULTS, lay.probe_batches(inputs["batches"]))):
            skipped = lay.skipped_steps(faults)
            for step in range(1, len(batches) + 1):
                for r in range(N):
                    out = _run_of(res[r], run)
                    norms = out.get("norms") or []
                    got = norms[step - 1] if step - 1 < len(norms) else None
                    where = (f"at step {step}" if run == "main" else
                             f"at step {step} of the second run (a fresh optimizer, {lay.PROBE_STEPS} steps)")
                    if step in skipped:
                        if isinstance(got, float) and not math.isfinite(got):
                            continue
                        fault = next(f for f in faults if f.step == step)
                        return Check(name, False, f"rank {r} reported {_shown(got)} {where}, where the harness wrote "
                                     f"{fault.describe().rsplit(' at', 1)[0]}: the global norm adds every rank's "
                                     f"squares, so it is not finite on any rank there (report the norm you found: "
                                     f"clip_grad_norm_ returns it)",
                                     diagnosis=safe_diagnosis(diagnose_finite_norm, res, run, step, r))
                    grads = forced_gradient(res, inputs, run, step, r, batches)
                    if grads is None:
                        continue  # the weights before this step are not finite: the weights check says so
                    want = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
                    if isinstance(got, float) and abs(got - want) <= TOL * max(1.0, abs(want)):
                        continue
                    return Check(name, False, f"rank {r} reported the norm {_shown(got)} {where}; the serial "
                                 f"clip_grad_norm_ at this rank's own weights gives {want:.10g} (the norm of the whole "
                                 f"model's gradient, before clipping; tolerance 1e-8 x max(1, norm))",
                                 diagnosis=safe_diagnosis(diagnose_norm, got, grads, r, want))
        return Check(name, True, f"every rank reported clip_grad_norm_'s norm at every step (the serial norm at its "
                                 f"own weights, tolerance 1e-8 relative), and a norm that is not finite at each faulty "
                                 f"step (steps {', '.join(str(f.step) for f in FAULTS)}, and step "
                                 f"{PROBE_FAULTS[0].step} of the second run)")

    def check_skips(self, res) -> Check:
        name = "skipped steps"
        for run, faults in (("main", FAULTS), ("probe", PROBE_FAULTS)):
            for fault in faults:
                found = [(_run_of(res[r], run).get("skips") or {}).get(fault.step) for r in range(N)]
                changed = {r: c for r, c in enumerate(found) if c}
                if not changed and all(c is not None for c in found):
                    continue
                where = f"step {fault.step}" + ("" if run == "main" else " of the second run (a fresh optimizer)")
                shown = "; ".join(f"rank {r}: " + ", ".join(f"{c['path']} ({c['changed']:,} of {c['numel']:,} "
                                                             f"entries)" for c in cs[:2]) for r, cs in changed.items())
                kept = [r for r in range(N) if r not in changed]
                message = (f"at {where} the harness wrote {fault.describe().rsplit(' at', 1)[0]}, and every rank "
                           f"must skip the step alike; but {len(changed)} of {N} ranks changed what a skipped step "
                           f"leaves as it was: {shown}" + (f". Unchanged: rank(s) {', '.join(map(str, kept))}"
                                                          if kept else ""))
                return Check(name, False, message, diagnosis=safe_diagnosis(diagnose_skip, res, run, fault, found))
        steps = ", ".join(str(f.step) for f in FAULTS)
        return Check(name, True, f"at steps {steps} and step {PROBE_FAULTS[0].step} of the second run, whose gradients "
                                 f"held an inf or a NaN on one rank, no rank changed its weights or its optimizer's "
                                 f"state")

    def check_state(self, res, budget: Budget) -> Check:
        states = [max(r.get("state_per_step") or [0]) for r in res]
        worst = max(range(N), key=states.__getitem__)
        held = states[worst]
        ok = held <= budget.value
        message = (f"rank {worst} held up to {fmt(held, 'bytes')} of optimizer state between steps ({held / SHARD:.3g} "
                   f"bytes per element of its shard, Ψ_r/D = {SHARD:,}), {'within' if ok else 'over'} the budget "
                   f"{budget.describe()}. Per rank: {', '.join(f'{s:,}' for s in states)}")
        return Check("optimizer state", ok, message, measured=held, budget=budget,
                     diagnosis="" if ok else safe_diagnosis(diagnose_state, worst, held, res[worst].get("kept")))


# ---- the steps the harness runs, on the rank


def steps(dist, opt, params, xs, targets, faults, tp_group, before) -> dict:
    """Forward, backward, the faults of this rank, step() and what the checks read, one batch a step. `before`:
    the bytes held before the optimizer was made (None: the state is not measured)."""
    rank = dist.get_rank()
    named = dict(zip(PARAM_NAMES, params))
    skipped = lay.skipped_steps(faults)
    out = {"weights": [], "norms": [], "skips": {}, "state_per_step": []}
    for step, (x, target) in enumerate(zip(xs, targets), 1):
        loss = loss_fn(pair_forward(dist, tp_group, x, params), target)
        loss.backward()
        del loss
        for fault in faults:
            if fault.step == step and fault.rank == rank:
                inject(params, fault)
        taken = snapshot(opt, named) if step in skipped else None
        out["norms"].append(as_number(opt.step()))
        for p in params:
            p.grad = None
        if taken is not None:
            out["skips"][step] = changes(taken, opt, named)
            del taken
        if before is not None:
            out["state_per_step"].append(probe.memory_now() - before)
        out["weights"].append(record(params))
    return out


def kept_state(opt, params) -> list[tuple[str, int, str]]:
    """(path, elements, dtype) of every tensor the optimizer keeps, the parameters themselves left out."""
    theirs = {p.untyped_storage().data_ptr() for p in params}
    return [(path, t.numel(), str(t.dtype).replace("torch.", "")) for path, t in state_tensors(opt)
            if t.untyped_storage().data_ptr() not in theirs]


# ---- what the checks compare with, and their diagnoses


REPLAYED = (
    ({"clamp": False}, "the clipping coefficient max_norm / (norm + 1e-6) was applied at every step, also where it is "
                       "above 1 (the norm below max_norm, step 1 and 4): clip_grad_norm_ clamps it, min(1, ...), so "
                       "that small gradients are never scaled up"),
    ({"clip": False}, "the gradients were not clipped: multiply them by min(1, max_norm / (norm + 1e-6)) before Adam"),
    ({"count_skipped": True}, "Adam's step count t counted the skipped step 3: a skipped step changes nothing, its "
                              "count included (at step 4, t = 3: steps 1, 2 and 4 were taken)"),
)


def forced_gradient(res, inputs, run, step, rank, batches):
    """The serial gradient of `step` at the weights the answer's tensor-parallel pair of `rank` held before it (the
    replicated ones `rank`'s own), or None when they are not finite."""
    def before(r):
        if step == 1:
            return lay.rank_params(inputs["params"], r)
        out = _run_of(res[r], run)
        w = _pairs_of(out.get("weights"))
        return w[step - 2] if step - 2 < len(w) else None

    pair = [before(r) for r in lay.tp_ranks(rank)]
    own = before(rank)
    if any(p is None or len(p) != len(PARAM_NAMES) for p in pair + [own]):
        return None
    params = lay.assemble(pair, own)
    if not all(torch.isfinite(t).all() for t in params.values()):
        return None
    return lay.gradient(params, batches[step - 1])


def diagnose_norm(got, grads, rank, want) -> str:
    if not isinstance(got, float):
        return "step() must return the global norm, a number (a float or a tensor of one element)"
    hits = [text for value, text in lay.norm_candidates(grads, rank) if abs(got - value) <= TOL * max(1.0, value)]
    coef = min(1.0, lay.MAX_NORM / (want + lay.CLIP_EPS))
    if coef < 1 and abs(got - want * coef) <= TOL * max(1.0, want):
        hits.append("the norm after clipping (max_norm): report the norm before clipping, as clip_grad_norm_ returns")
    return hits[0] if len(hits) == 1 else ""


def diagnose_finite_norm(res, run, step, rank) -> str:
    if run == "main" and step == FAULTS[1].step and _all_finite_at(res, run, step) and \
            not _all_finite_at(res, "main", FAULTS[0].step):
        return _COPY_UNSEEN
    return (f"rank {rank}'s norm did not include the other ranks' squares (a local norm, or an all-reduce over one "
            f"group only)")


_COPY_UNSEEN = (f"at step {FAULTS[1].step} the inf is in rank {FAULTS[1].rank}'s copy of {FAULTS[1].param}, a replicated "
                f"parameter (the other copy, on rank {lay.tp_ranks(FAULTS[1].rank)[0]}, is finite), and no rank's norm "
                f"saw it: a replicated parameter counted on one rank of the pair only. Count it once in the norm, but "
                f"let every copy's inf or NaN through: divide its squares by {T} on each rank of the pair, or check "
                f"every gradient for inf and NaN and all-reduce that flag too")


def _all_finite_at(res, run, step) -> bool:
    return all(_norm_at(res, run, step, r) is not None and math.isfinite(_norm_at(res, run, step, r))
               for r in range(N))


def diagnose_skip(res, run, fault, found) -> str:
    """Name why the ranks did not all skip, from who changed what and the norms they reported at that step."""
    own = [[c for c in (cs or []) if not c["path"].startswith("layers[")] for cs in found]  # the optimizer's own
    took = [r for r in range(N) if own[r]]
    finite = [r for r in range(N) if _norm_at(res, run, fault.step, r) is not None
              and math.isfinite(_norm_at(res, run, fault.step, r))]
    if 0 < len(took) < N or 0 < len(finite) < N:
        split = (f"rank(s) {', '.join(map(str, sorted(set(range(N)) - set(took))))} left their optimizer's state as it "
                 f"was and rank(s) {', '.join(map(str, took))} updated theirs" if 0 < len(took) < N else
                 f"rank(s) {', '.join(map(str, finite))} reported a finite norm and the others did not")
        return (f"a rank-local skip: at step {fault.step} {split}. The fault was written into rank {fault.rank}'s "
                f"gradient and, after the reduce-scatter, lies in one rank's shard: the others see it only through "
                f"what every rank shares. Decide the skip from the all-reduced norm (not finite on every rank when any "
                f"rank's squares are not), or from a flag all-reduced over every rank")
    if run == "probe" and not any((_run_of(res[r], "main").get("skips") or {}).get(f.step) for r in range(N)
                                  for f in FAULTS):
        return ("the skip follows the step's number, not the gradients: in the second run the fault comes at step "
                f"{fault.step}. Decide from the norm (or a flag) of each step's own gradients")
    if run == "main" and fault is FAULTS[1] and len(finite) == N:
        return _COPY_UNSEEN
    if fault.value == float("inf") and not finite and _all_skipped(res, "main", FAULTS[0].step):
        return ("every rank found the norm inf and took the step anyway, though the NaN step was skipped: "
                "torch.isnan misses an inf. Skip when the norm is not finite (torch.isfinite, math.isfinite)")
    return (f"no rank skipped step {fault.step}: its inf or NaN went into the update. Skip every update (and Adam's "
            f"step count) when the global norm is not finite")


def _run_of(out: dict, run: str) -> dict:
    return out if run == "main" else (out.get("probe") or {})


def _norm_at(res, run, step, rank):
    norms = _run_of(res[rank], run).get("norms") or []
    got = norms[step - 1] if step - 1 < len(norms) else None
    return got if isinstance(got, float) else None


def _all_skipped(res, run, step) -> bool:
    found = [(_run_of(res[r], run).get("skips") or {}).get(step) for r in range(N)]
    return all(c is not None and not c for c in found)


def diagnose_communication(rank, by_kind) -> str:
    """Name what carried more than a few scalars, from the bytes of each kind of collective."""
    reduced = by_kind.get("all_reduce", (0, 0))[1]
    if reduced > BOOKKEEPING_BYTES:
        name = sized_like(reduced, {
            "the whole gradient all-reduced over the data-parallel group at each step (a reduce-scatter carries "
            "half of it, all that ZeRO-2 needs)": STEPS_IN_ALL * REDUCTION,
            "the whole gradient all-reduced over every rank at each step":
                STEPS_IN_ALL * 2 * (N - 1) * F64 * PSI_RANK // N,
            "the gradient shard all-reduced over the tensor-parallel pair at each step":
                STEPS_IN_ALL * 2 * (T - 1) * F64 * SHARD // T})
        return (f"rank {rank}'s all-reduces carried {reduced:,} bytes" + (f", the size of {name}" if name else "")
                + ": the norm needs one number from each rank, its sum of squares")
    gathered = sum(b for kind, (_, b) in by_kind.items() if kind.startswith("all_gather"))
    if gathered > STEPS_IN_ALL * REDUCTION // 2 + BOOKKEEPING_BYTES:
        return (f"rank {rank}'s all-gathers carried {gathered:,} bytes, more than the weights' all-gather at every "
                f"step ({STEPS_IN_ALL} x {REDUCTION // 2:,}): were gradients gathered for the norm? One number from "
                f"each rank, its sum of squares, is all the norm needs")
    return ""


def diagnose_state(rank, held, kept) -> str:
    """Name what the optimizer keeps beyond its shard's master, m and v, from the tensors it holds (its attributes,
    read after the first run): sizes alone cannot tell replicated m and v (2·8·Ψ_r) from a fourth shard-sized
    float64 vector beside master, m and v (4·8·Ψ_r/D: the same bytes, with D = 2)."""
    kept = [k for k in (kept or []) if isinstance(k, (list, tuple)) and len(k) == 3]
    if not kept:
        return ""
    sizes = {p.numel() for p in lay.rank_params(lay.init_params(0), rank)}
    whole = [path for path, numel, _ in kept if numel in sizes and numel != SHARD]
    shown = ", ".join(f"{path} ({numel:,} {dtype})" for path, numel, dtype in kept[:6])
    if whole and sum(numel for _, numel, _ in kept) >= 2 * PSI_RANK:
        return (f"rank {rank}'s optimizer keeps state the size of every parameter of the rank ({shown}): Adam is "
                f"replicated over the data-parallel pair. Keep master, m and v for the rank's 1/{D} shard only (ZeRO-2)")
    return (f"rank {rank}'s optimizer keeps {shown}{', ...' if len(kept) > 6 else ''}: master, m and v of the "
            f"shard are {3 * F64 * SHARD:,} bytes; the rest is what goes over (a float64 mask or weight per element, "
            f"where a bool mask costs a byte and Python ranges nothing? a gradient kept between steps?)")


def _slice_text(name: str, rank: int) -> str:
    _, tp = lay.coords(rank)
    cols = f"{tp * lay.HS}:{(tp + 1) * lay.HS}"
    return {"w1": f" (serial w1[:, {cols}])", "w2": f" (serial w2[{cols}, :])"}.get(name.split(".")[-1], "")


def _shown(value) -> str:
    if isinstance(value, float):
        return f"{value:.10g}"
    return "nothing" if value is None else str(value)[:80]


SPEC = GlobalClipping()
