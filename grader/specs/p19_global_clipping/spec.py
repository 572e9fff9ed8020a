"""p19 numerics under sharding: global gradient clipping and non-finite steps, on ZeRO-2 shards of a model split
across a tensor-parallel pair (4 ranks: 2 replicas x 2 tensor-parallel ranks).

The learner writes the optimizer: reduce-scatter the gradients, the global norm from every rank's share of the
squares (each parameter counted once: the replicated ones not once per copy), clip_grad_norm_'s coefficient, Adam on
the shard, all-gather; and when any rank's gradient holds an inf or a NaN, every rank skips the step alike. The
harness runs the forward and backward (harness.py), writes the faults into one rank's gradient
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

from puzzles.sim import CostModel

from ...core import probe
from ...core.compare import safe_diagnosis, tensor_mismatch
from ...core.result import Budget, Check, fmt
from ...core.rules import BOOKKEEPING_BYTES, communication_check
from ...core.spec import Observation, PuzzleSpec
from . import layout as lay
from .diagnoses import (REPLAYED, diagnose_communication, diagnose_finite_norm, diagnose_norm, diagnose_skip,
                        diagnose_state, forced_gradient, never_gathered, pairs_of, replicas_agree)
from .harness import kept_state, make_groups, steps
from .layout import (F64, FAULTS, K_STEPS, N, PARAM_NAMES, PROBE_FAULTS, PSI_RANK, REDUCTION, SHARD, STEPS_IN_ALL, TOL,
                     run_of)

COST = CostModel(latency_ticks=8, bytes_per_tick=512)  # puzzle 8's network
STATE_BYTES_PER_ELEMENT = 3 * F64 + 1  # master, m, v in float64, and a byte for a mask of the replicated ones


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
        norms, norm_step = self.check_norms(res, inputs)
        skips = self.check_skips(res)
        weights = self.check_weights(res, ref, inputs, norm_step, skips)
        learner = Observation(obs.results, obs.peak_bytes, obs.ledgers,
                              [e for e in obs.events if not str(e.get("site", "")).startswith("[harness]")],
                              obs.makespan, obs.warnings, obs.backend)
        return [weights, norms, skips,
                communication_check(learner, budgets["communication"], diagnose=diagnose_communication),
                self.check_state(res, budgets["optimizer state"])]

    def check_weights(self, res, ref, inputs, norm_step, skips: Check) -> Check:
        name = "weights after each step"
        expected = ref["main"]["weights"]
        for step in range(1, K_STEPS + 1):
            bad = []
            for r in range(N):
                got = pairs_of(res[r].get("weights"))
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
                diagnosis = safe_diagnosis(self.diagnose_weights, res, inputs, step, bad, norm_step, skips,
                                           expected[step - 1])
                return Check(name, False, message, diagnosis=diagnosis)
        skipped = " and ".join(str(s) for s in sorted(lay.skipped_steps(FAULTS)))
        return Check(name, True, f"every rank's weights after each of the {K_STEPS} steps match clip_grad_norm_ and "
                                 f"torch.optim.Adam on the serial model (float64, tolerance 1e-8 x max(1, largest "
                                 f"|expected|)), steps {skipped} skipped")

    def diagnose_weights(self, res, inputs, step, bad, norm_step, skips: Check, expected) -> str:
        if step in lay.skipped_steps(FAULTS) and not skips.passed:
            return "follows from the faulty step (see the skipped steps check)"
        if norm_step is not None and norm_step <= step:
            return ("follows from the norm (see the global norm check): the clipping coefficient max_norm / (norm + "
                    "1e-6) is computed from it")
        if never_gathered(res, inputs, step, expected):
            return (f"every rank updated its own shard at step {step} and holds the other replica's half as it was "
                    f"before the step: the updated shards were never all-gathered into the parameters "
                    f"(all_gather_into_tensor over dp_group, then copy into every parameter)")
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

    def check_norms(self, res, inputs) -> tuple[Check, int | None]:
        """The check, and the step of the main run where it first failed (None: it did not fail there). A step is
        judged only while the two replicas held the same weights before it (else there is no one model whose norm
        the ranks should report: the weights check says why)."""
        name = "global norm"
        for run, faults, batches in (("main", FAULTS, inputs["batches"]),
                                     ("probe", PROBE_FAULTS, lay.probe_batches(inputs["batches"]))):
            skipped = lay.skipped_steps(faults)
            at = (lambda step, run=run: step if run == "main" else None)
            for step in range(1, len(batches) + 1):
                if not replicas_agree(res, inputs, run, step):
                    break
                for r in range(N):
                    out = run_of(res[r], run)
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
                                     diagnosis=safe_diagnosis(diagnose_finite_norm, res, run, step, r)), at(step)
                    grads = forced_gradient(res, inputs, run, step, r, batches)
                    if grads is None:
                        continue  # the weights before this step are not finite: the weights check says so
                    want = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
                    if isinstance(got, float) and abs(got - want) <= TOL * max(1.0, abs(want)):
                        continue
                    return Check(name, False, f"rank {r} reported the norm {_shown(got)} {where}; the serial "
                                 f"clip_grad_norm_ at this rank's own weights gives {want:.10g} (the norm of the whole "
                                 f"model's gradient, before clipping; tolerance 1e-8 x max(1, norm))",
                                 diagnosis=safe_diagnosis(diagnose_norm, got, grads, r, want)), at(step)
        return Check(name, True, f"every rank reported clip_grad_norm_'s norm at every step (the serial norm at its "
                                 f"own weights, tolerance 1e-8 relative), and a norm that is not finite at each faulty "
                                 f"step (steps {', '.join(str(f.step) for f in FAULTS)}, and step "
                                 f"{PROBE_FAULTS[0].step} of the second run)"), None

    def check_skips(self, res) -> Check:
        name = "skipped steps"
        for run, faults in (("main", FAULTS), ("probe", PROBE_FAULTS)):
            for fault in faults:
                found = [(run_of(res[r], run).get("skips") or {}).get(fault.step) for r in range(N)]
                changed = {r: c for r, c in enumerate(found) if c}
                if not changed and all(c is not None for c in found):
                    continue
                where = f"step {fault.step}" + ("" if run == "main" else " of the second run (a fresh optimizer)")
                shown = "; ".join(f"rank {r} {_what_changed(cs)}" for r, cs in changed.items())
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


def _what_changed(changes: list) -> str:
    """'its optimizer's opt.m (4,160 of 4,160 entries), opt.v (...) and 8 of its 8 parameters (layers[0].norm, ...)'."""
    own = [c for c in changes if not c["path"].startswith("layers[")]
    params = [c for c in changes if c["path"].startswith("layers[")]
    parts = []
    if own:
        parts.append("its optimizer's " + ", ".join(f"{c['path']} ({c['changed']:,} of {c['numel']:,} entries)"
                                                      for c in own[:2]) + (", ..." if len(own) > 2 else ""))
    if params:
        parts.append(f"{len(params)} of its {len(PARAM_NAMES)} parameters ("
                     + ", ".join(c["path"] for c in params[:2]) + (", ..." if len(params) > 2 else "") + ")")
    return "changed " + " and ".join(parts)


def _slice_text(name: str, rank: int) -> str:
    _, tp = lay.coords(rank)
    cols = f"{tp * lay.HS}:{(tp + 1) * lay.HS}"
    return {"w1": f" (serial w1[:, {cols}])", "w2": f" (serial w2[{cols}, :])"}.get(name.split(".")[-1], "")


def _shown(value) -> str:
    if isinstance(value, float):
        return f"{value:.10g}"
    return "nothing" if value is None else str(value)[:80]


SPEC = GlobalClipping()
