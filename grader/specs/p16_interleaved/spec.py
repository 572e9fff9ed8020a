"""p16 interleaved 1F1B: 8 one-block stages on 4 ranks, 2 chunks each (rank r: stages r and r + 4), 8 microbatches.

    chunk and input gradients    every w.grad and both returned input gradients against the serial step
    stage compute                each rank's two blocks, each microbatch forward once and backward once
    bubble                       (makespan - W)/W, W the last rank's own work (its compute where that is less):
                                 at most (p-1)/(v·m) + 1 point, once the schedule read off the messages is
                                 possible (common/pipeline_schedule.py)
    activation memory            every rank's peak less what it must hold anyway, at most the interleaved bound
    point-to-point bytes         exactly one message per chunk boundary crossed, each way (v times 1F1B's)

The layout, the order and the value diagnoses live in layout.py.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from puzzles.model import init_layers, make_batch

from ...core.compare import safe_diagnosis, values_check
from ...core.result import Budget, Check, fmt
from ...core.rules import BOOKKEEPING_BYTES, compute_check, describe_sent, flops, most_held, sent, work_sequence
from ...core.schedule import Relay, arrivals, departures, peak_ticks
from ...core.spec import Observation, PuzzleSpec
from ..common.pipeline_schedule import impossible
from .layout import (ALLOWANCE, CHUNK_ACT, CHUNK_BACKWARD, CHUNK_FORWARD, CONTRACT, COST, LOSS_BACKWARD, LOSS_FORWARD,
                     MESSAGE, PRODUCTS, STAGES, WORK, B, D, H, L, M, MB, P, V, diagnose_values, messages_sent,
                     most_in_flight, one_f_one_b_messages, serial, value_pairs, warmup)

TOLERANCE = Fraction(1, 100)  # a point above (p-1)/(v·m): the 1-tick messages, the returned gradients' cat
BUBBLE = Fraction(P - 1, V * M)
WEIGHTS = V * 2 * D * H * 8  # this rank's weights; their gradients are as many bytes again


def static_bytes(rank: int) -> int:
    """What a rank holds whatever its schedule: its weights and their gradients, x (rank 0) or target (rank 3), and
    the two input gradients it returns."""
    handed = B * D * 8 if rank in (0, P - 1) else 0
    return 2 * WEIGHTS + handed + V * B * D * 8


# The interleaved order holds at most v·p + p - 1 chunk activations (on rank 0: its warm-up forwards and one more);
# a weight's fresh gradient exists for a moment before autograd adds it into w.grad; and half a chunk activation of
# slack for the buffers received (rank 0 receives chunk 1's inputs, p of them held at once) and temporaries.
BOUND = most_in_flight(0) * CHUNK_ACT + D * H * 8 + CHUNK_ACT // 2


class Interleaved(PuzzleSpec):
    id, name, title = "p16", "interleaved", "Interleaved 1F1B (virtual stages)"
    entries = ("interleaved_step",)
    world_size = P
    cost = COST
    simulator_only = ("bubble",)  # read off the simulated clock's makespan
    hints = ("Rank r runs (p - r - 1)·2 + (v - 1)·p warm-up forwards, then one forward and one backward at a "
             "time, then the backwards left over.",
             "Forwards in groups of p microbatches, chunk 0 then chunk 1; backwards in the same groups, chunk 1 "
             "first.",
             "Chunk c's input comes from rank (r - 1) % p and its output goes to rank (r + 1) % p.")

    def make_inputs(self, seed):
        x, target = make_batch(B, D, seed)
        return {"layers": init_layers(L, D, H, seed + 1), "x": x, "target": target}

    def reference(self, inputs):
        return serial(inputs)

    def launch(self, inputs):
        per_rank = [([[inputs["layers"][c * P + r]] for c in range(V)], inputs["x"] if r == 0 else None,
                     inputs["target"] if r == P - 1 else None) for r in range(P)]
        return (M, (MB, D)), per_rank

    def program(self, module):
        step = module.interleaved_step

        def run(dist, n_micro, micro_shape, chunks, x, target):
            for chunk in chunks:  # zeroed gradients, as after optimizer.zero_grad(set_to_none=False)
                for w1, w2 in chunk:
                    w1.grad, w2.grad = torch.zeros_like(w1), torch.zeros_like(w2)
            grads = step(dist, chunks, x, target, n_micro, micro_shape)
            if isinstance(grads, (list, tuple)):
                grads = [g.detach() if isinstance(g, torch.Tensor) else g for g in grads]
            return {"grads": [[(w1.grad, w2.grad) for w1, w2 in chunk] for chunk in chunks], "input_grads": grads}

        return run

    def budgets(self, inputs):
        last = WORK[P - 1]
        expected = [messages_sent(r) * MESSAGE for r in range(P)]
        return {
            "stage compute": Budget("stage compute", f"m·v·(F/v + BW/v) + m·(LF + LB) + m·mb·d (every microbatch "
                                    f"forward once through each chunk, F/v = {CHUNK_FORWARD.flops:,}, and backward "
                                    f"once, BW/v = {CHUNK_BACKWARD.flops:,}; the last stage's loss, LF + LB = "
                                    f"{(LOSS_FORWARD + LOSS_BACKWARD).flops:,}; m·mb·d for bookkeeping)",
                                    last.flops + ALLOWANCE, "count"),
            "bubble": Budget("bubble", "(p-1)/(v·m) + 1 point = 3/16 + 0.01", float(BUBBLE + TOLERANCE),
                             "fraction"),
            "activation memory": Budget(
                "activation memory", f"(v·p + p - 1)·A_c + d·h·8 + A_c/2 bytes (A_c = one "
                f"microbatch's activations in one chunk, {CHUNK_ACT:,} bytes; 11 held at most, on rank 0)", BOUND,
                "bytes"),
            "point-to-point bytes": Budget(
                "point-to-point bytes", "one microbatch (mb·d·8 bytes) per chunk boundary crossed, each way: "
                f"{' / '.join(f'{e:,}' for e in expected)} on ranks 0-{P - 1}, + 1 KiB",
                max(expected) + BOOKKEEPING_BYTES, "bytes"),
        }

    def memory_lines(self, inputs):
        return [static_bytes(r) + BOUND for r in range(P)]

    # ---- checks

    def check(self, obs: Observation, ref, inputs):
        grad_pairs, input_pairs = value_pairs(obs, ref)
        cause = {}

        def diagnose(_bad):
            if "text" not in cause:
                cause["text"] = diagnose_values(obs, ref, inputs, grad_pairs, input_pairs)
            return cause["text"]

        budgets = self.budgets(inputs)
        values = [values_check("chunk gradients", grad_pairs, "chunk gradients", diagnose),
                  values_check("input gradients", input_pairs, "input gradients", diagnose)]
        return [*values,
                compute_check(obs, budgets["stage compute"], self.diagnose_compute, name="stage compute",
                              least=M * V * PRODUCTS),
                self.bubble_check(obs, budgets["bubble"], all(c.passed for c in values)),
                self.memory_check(obs, budgets["activation memory"]),
                self.bytes_check(obs, budgets["point-to-point bytes"])]

    @staticmethod
    def sequence(obs: Observation, rank: int) -> str:
        """'FFFFBFB...': the rank's chunk forwards and backwards in the order they ran, read off the FLOPs (both
        chunks cost the same; on the last rank, half of them carry the loss, counted as half a loss each)."""
        f, b = CHUNK_FORWARD.flops, CHUNK_BACKWARD.flops
        if rank == P - 1:
            f, b = f + LOSS_FORWARD.flops // V, b + LOSS_BACKWARD.flops // V
        return work_sequence(obs, rank, f, b)

    @staticmethod
    def drained(sequence: str) -> int | None:
        """Where a rank held nothing again with forwards still to run (a flush of the pipeline), if it did."""
        held, forwards = 0, 0
        for k, op in enumerate(sequence):
            held, forwards = held + (1 if op == "F" else -1), forwards + (op == "F")
            if held == 0 and 0 < forwards < M * V:
                return k
        return None

    @staticmethod
    def relays(obs: Observation, rank: int) -> list[Relay]:
        """Rank r's chunks' work between its messages (core/schedule.py), on the ring of ranks the chunks make:
        activations come from r-1 and go to r+1 (mod p), gradients the other way. Forward: each activation sent
        needs a chunk's forward since an input arrived (rank 0's chunk 0 reads the batch, there from the start);
        backward: each gradient sent needs a chunk's input gradient since a gradient arrived (the last rank's last
        chunk starts from its loss, counted as there from the start); and every chunk's backward ends by the rank's
        last compute. One chunk is one block: F, B and W products are each a third of PRODUCTS."""
        prev, next_, least, unit = (rank - 1) % P, (rank + 1) % P, MESSAGE // 4, PRODUCTS // 3
        held = [0] * M if rank == 0 else []  # chunk 0's input on rank 0: the batch
        fed = sorted(held + arrivals(obs, rank, prev, least, count=V * M - len(held)))
        grads = sorted(([0] * M if rank == P - 1 else [])
                       + arrivals(obs, rank, next_, least, count=V * M - (M if rank == P - 1 else 0)))
        end = max((e["end"] for e in obs.events_of(rank, "compute")), default=0)
        return [Relay("chunk forward", tuple(fed), tuple(departures(obs, rank, next_, least)), unit,
                      (f"activation from rank {prev}", f"activation to rank {next_}")),
                Relay("chunk backward", tuple(grads), tuple(departures(obs, rank, prev, least)), unit,
                      (f"gradient from rank {next_}", f"gradient to rank {prev}")),
                Relay("chunk backward", tuple(grads), (end,) * (V * M), 2 * unit,
                      (f"gradient from rank {next_}", None))]

    def bubble_check(self, obs: Observation, budget: Budget, values_right: bool = True) -> Check:
        floor = peak_ticks((P - 1) * (PRODUCTS // 3) + V * M * PRODUCTS, COST.device)
        refused = impossible(obs, lambda r: self.relays(obs, r), floor, "the products of (p-1) chunk forwards and "
                             "the last rank's m·v chunk forwards and backwards", budget, values_right)
        if refused is not None:
            return refused
        busy = obs.busy_ticks(P - 1)
        work = min(WORK[P - 1].ticks, busy)  # its own compute where that is less: a bubble is never below zero
        bubble = (obs.makespan - work) / work if obs.makespan and work else 0.0
        ok = bubble <= budget.value
        ideal = (V * M + P - 1) * (CHUNK_FORWARD + CHUNK_BACKWARD).ticks + M * (LOSS_FORWARD + LOSS_BACKWARD).ticks
        own = (f" (counted as its own compute, {fmt(busy, 'ticks')}, where that is less)"
               if busy < WORK[P - 1].ticks else "")
        message = (f"the step took {fmt(obs.makespan, 'ticks')} against the last rank's own work of W = "
                   f"m·v·(F/v + BW/v) + m·(LF + LB) = {fmt(WORK[P - 1].ticks, 'ticks')}{own}: a bubble of "
                   f"(makespan - W)/W = "
                   f"{fmt(bubble, 'fraction')}, {'within' if ok else 'over'} the budget {budget.describe()} "
                   f"(1F1B's: (p-1)/m = {fmt(float(Fraction(P - 1, M)), 'fraction')}; a perfect interleaved pipeline "
                   f"takes (v·m + p - 1)·(F + BW)/v + m·(LF + LB) = {fmt(ideal, 'ticks')}). Compute per rank: "
                   f"{', '.join(f'{obs.busy_ticks(r):,}' for r in range(P))} ticks")
        return Check("bubble", ok, message, measured=round(bubble, 6), budget=budget,
                     diagnosis="" if ok else safe_diagnosis(self.diagnose_bubble, obs))

    def memory_check(self, obs: Observation, budget: Budget) -> Check:
        held = [obs.peak_bytes[r] - static_bytes(r) for r in range(P)]
        over = [r for r in range(P) if held[r] > budget.value]
        r = over[0] if over else max(range(P), key=held.__getitem__)
        ok = not over
        units = max(0.0, (held[r] - D * H * 8) / CHUNK_ACT)
        message = (f"rank {r} peaked at {fmt(obs.peak_bytes[r], 'bytes')}, {fmt(held[r], 'bytes')} above its "
                   f"weights, gradients, inputs and returned gradients ({static_bytes(r):,} bytes): about "
                   f"{units:.1f} chunk activations (A_c = {CHUNK_ACT:,} bytes each) and a weight gradient's "
                   f"workspace, {'within' if ok else 'over'} the budget {budget.describe()}. Per rank: "
                   f"{', '.join(f'{h:,}' for h in held)} bytes")
        return Check("activation memory", ok, message, measured=held[r], budget=budget,
                     diagnosis="" if ok else safe_diagnosis(self.diagnose_memory, obs, r))

    def bytes_check(self, obs: Observation, budget: Budget) -> Check:
        by_rank = [sent(obs, r) for r in range(P)]
        totals = [sum(b for _, b in k.values()) for k in by_rank]
        expected = [messages_sent(r) * MESSAGE for r in range(P)]
        off = [r for r in range(P) if not expected[r] <= totals[r] <= expected[r] + BOOKKEEPING_BYTES]
        r = off[0] if off else max(range(P), key=totals.__getitem__)
        ok = not off
        relation = "as" if ok else ("below" if totals[r] < expected[r] else "over")
        ratios = ", ".join(f"{totals[q] / (one_f_one_b_messages(q) * MESSAGE):.2f}x" for q in range(P))
        message = (f"rank {r} sent {fmt(totals[r], 'bytes')} ({describe_sent(by_rank[r])}), {relation} the "
                   f"{messages_sent(r)} messages of {MESSAGE:,} bytes its chunks' boundaries take "
                   f"({fmt(expected[r], 'bytes')}, + 1 KiB). Per rank: {', '.join(f'{t:,}' for t in totals)} bytes; "
                   f"against 1F1B's ({', '.join(f'{one_f_one_b_messages(q) * MESSAGE:,}' for q in range(P))}): "
                   f"{ratios}")
        return Check("point-to-point bytes", ok, message, measured=totals[r], budget=budget,
                     diagnosis="" if ok else safe_diagnosis(self.diagnose_bytes, r, by_rank[r], totals[r],
                                                            expected[r]))

    # ---- diagnoses

    @staticmethod
    def diagnose_compute(rank, fwd, bwd) -> str:
        f, b = CHUNK_FORWARD.flops, CHUNK_BACKWARD.flops
        if abs(fwd - 2 * M * V * f) < f and abs(bwd - M * V * b) < b:
            return (f"rank {rank} ran every chunk's forward twice (2·m·v forwards outside backward): recomputation. "
                    f"Keep each microbatch's activations from its forward to its backward")
        return (f"rank {rank} computed {fwd / f:.1f} chunk forwards' worth outside backward and {bwd / b:.1f} "
                f"backwards' worth inside it; a rank runs m·v = {M * V} of each")

    def diagnose_bubble(self, obs: Observation) -> str:
        if any(obs.busy_ticks(r) > WORK[r].ticks * Fraction(21, 20) for r in range(P)):
            return "the ranks computed more than their chunks' work (see stage compute), and the step took longer"
        sequences = [self.sequence(obs, r) for r in range(P)]
        flushed = self.drained(sequences[0])
        if flushed is not None:
            done = sequences[0][:flushed + 1].count("F")
            return (f"rank 0 drained: after {done} of its {M * V} forwards it had backwarded every one of them and "
                    f"held nothing, so the pipeline emptied and filled again ({sequences[0]}). Each fill and drain "
                    f"costs p-1 slots: the steady state must run the next group's forwards while the last group's "
                    f"backwards come in, one forward, one backward")
        ahead = [s.index("B") if "B" in s else len(s) for s in sequences]
        want = [warmup(r) + 1 for r in range(P)]
        got = ", ".join(f"rank {r}: {a}" for r, a in enumerate(ahead))
        if any(a < w for a, w in zip(ahead, want)):
            return (f"forwards before the first backward: {got}; the interleaved order runs (p - r - 1)·2 + "
                    f"(v - 1)·p + 1 of them: {', '.join(map(str, want))}. With fewer, a rank reaches a backward "
                    f"whose gradient cannot have come back yet (a microbatch goes round the ranks v = {V} times "
                    f"first), or an activation its neighbour takes late holds up the gradient it sends after it (a "
                    f"rank's sends leave in the order it issued them, as on one NCCL stream), and the ranks wait on "
                    f"each other")
        idle = [1 - obs.busy_ticks(r) / obs.makespan for r in range(P)]
        return ("the ranks idled " + ", ".join(f"rank {r}: {fmt(v, 'fraction')}" for r, v in enumerate(idle))
                + f"; forwards before the first backward: {got} (the interleaved order: "
                f"{', '.join(map(str, want))}). Look at the schedule (--schedule) for where a rank waits on a message "
                f"it could have had earlier")

    def diagnose_memory(self, obs: Observation, rank: int) -> str:
        sequence = self.sequence(obs, rank)
        n, _ = most_held(sequence)
        limit = most_in_flight(rank)
        if sequence.count("F") > M * V:  # not this rank's own schedule: no guess at which order it ran
            return (f"rank {rank} computed {sequence.count('F')} chunk forwards' worth, where its {V} chunks take "
                    f"{M * V} ({M} microbatches each): it ran more of the model than its own chunks")
        if n >= M * V:
            return (f"rank {rank} ran all {M * V} of its forwards before its first backward and held every chunk "
                    f"activation at once (GPipe over the chunks). Start the backwards after (p - r - 1)·2 + "
                    f"(v - 1)·p warm-up forwards")
        if n > limit:
            return (f"rank {rank} held {n} chunk activations at once (forwards begun minus backwards done, read off "
                    f"the FLOPs); the interleaved order holds at most its warm-up forwards and one more, "
                    f"{limit} on rank {rank}: were there more warm-up forwards than (p - r - 1)·2 + (v - 1)·p?")
        top = obs.ledgers[rank].get("peak_by_line", [])[:3]
        sites = "; ".join(f"{s['site']}: {s['bytes']:,} bytes" for s in top)
        return (f"rank {rank} never held more than {n} chunk activations, as the interleaved order may, but kept "
                f"more alive than them: at the peak, {sites}. Drop each microbatch's tensors once its backward is "
                f"done (an isend's handle keeps its tensor until it is waited for)")

    @staticmethod
    def diagnose_bytes(rank, by_kind, total, expected) -> str:
        count = by_kind.get("send", (0, 0))[0]
        if total < expected and count == expected // MESSAGE and set(by_kind) <= {"send"}:
            return (f"rank {rank} sent the {count} messages its chunk boundaries take, but {total:,} bytes of the "
                    f"{expected:,} they carry ({MESSAGE:,} each): some went in a narrower dtype, or as a part of "
                    f"the tensor")
        if total < expected:
            return (f"rank {rank} sent {total // MESSAGE} messages' worth where its chunks take "
                    f"{expected // MESSAGE}: every chunk output but the last stage's goes to the next stage, every "
                    f"chunk input's gradient but stage 0's back to the previous one")
        kinds = set(by_kind) - {"send"}
        if kinds:
            return (f"rank {rank} used {', '.join(sorted(kinds))}: a pipeline moves activations and gradients "
                    f"between neighbouring stages by send and recv only")
        return (f"rank {rank} sent {(total - expected) / MESSAGE:.1f} microbatches' worth more than its chunk "
                f"boundaries take: each activation and each gradient crosses once")


SPEC = Interleaved()
