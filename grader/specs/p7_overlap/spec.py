"""p7 overlap: data parallel whose gradient all-reduces run asynchronously, hidden behind backward.

p3's rules (updated weights, each rank's compute share, the bytes it sends), and the makespan on the simulated
clock, measured as the communication left exposed: makespan - min(work, 1.25·C), at most about one block's
all-reduce A sticking out after backward, plus a tolerance T (work: the compute stream, less the copies and clones
that ran while a message was in flight, which hide nothing: core/rules.py). The cost model makes a block's
all-reduce (816 ticks) a bit shorter than a block's backward (1,078 ticks), so a good overlap hides all but the
last one, while synchronous all-reduces after backward leave all 8 x 432 ticks of communication exposed.
"""

from __future__ import annotations

from puzzles.sim import CostModel

from ...core.result import Budget, Check
from ...core.rules import (BOOKKEEPING_BYTES, COMPUTE_CAP, exposed_communication, overlap_check, sent, slow_compute)
from ...core.spec import Observation
from ..p3_data_parallel.spec import ALL_REDUCE_BYTES, FORWARD_BACKWARD, UPDATE, B, D, DataParallel, H, L, N, _close

ROWS = B // N  # b: rows per rank
COST = CostModel(latency_ticks=8, bytes_per_tick=512)
TOLERANCE_PERCENT = 5
COMMUNICATION_BUDGET = ALL_REDUCE_BYTES + BOOKKEEPING_BYTES  # p3's



def compute_ticks() -> int:
    """The step's compute on one rank, on the clock: p3's forward and backward on its b rows (every op counted),
    and the update of every weight (average, scale, subtract: memory-bound, 3 passes over each weight)."""
    return FORWARD_BACKWARD.ticks + UPDATE.ticks


def block_all_reduce_ticks() -> int:
    return COST.comm_ticks("all_reduce", 2 * D * H * 8, N)


def weight_all_reduce_ticks() -> int:
    return COST.comm_ticks("all_reduce", D * H * 8, N)


class Overlap(DataParallel):
    """p3's step (same sizes, inputs, reference and checks), graded on the clock too."""

    id, name, title = "p7", "overlap", "Comm/compute overlap"
    entries = ("overlapped_step",)
    cost = COST
    simulator_only = ("makespan",)  # the simulated clock's makespan
    probes_hooks = True
    hints = ("Launch each gradient's all-reduce with async_op=True from inside backward "
             "(w.register_post_accumulate_grad_hook), keep the handles, and wait for them all after backward.",)

    def expected_gradient(self, got, mean):
        """The text lets the average be taken in the learning rate (w -= lr / N * w.grad): w.grad may hold the
        all-reduced sum as well as the average; anything else is compared with the average."""
        return N * mean if _close(got, N * mean) else mean

    def budgets(self, inputs):
        c, a = compute_ticks(), block_all_reduce_ticks()
        t = c * TOLERANCE_PERCENT // 100
        return {**super().budgets(inputs),
                "makespan": Budget("makespan", f"communication left exposed, makespan - min(work, 1.25·C), at most "
                                               f"A + T = one block's all-reduce {a:,} + tolerance "
                                               f"{TOLERANCE_PERCENT}%·C {t:,} ticks (C = {c:,}, the step's compute)",
                                   a + t, "ticks")}

    def check(self, obs: Observation, ref, inputs):
        return super().check(obs, ref, inputs) + [overlap_check(obs, self.budgets(inputs)["makespan"], compute_ticks(),
                                                                COST.device, self.diagnose_schedule),
                                                  self.check_hooks(obs)]

    @staticmethod
    def check_hooks(obs: Observation) -> Check:
        """The text's rule: the step removes the hooks it registered. The program ran a backward through each
        returned weight after the step (probe.hooks_that_fire) and stopped any hook it called before its first
        line."""
        fired = [(r, res.get("hooks")) for r, res in enumerate(obs.results) if isinstance(res, dict)]
        left = [(r, hooks) for r, hooks in fired if hooks]
        weights = 2 * L
        if not left:
            return Check("hooks removed", True, f"after the step, a backward through each of the {weights} weights "
                                                f"fired no hook on any rank")
        r, hooks = left[0]
        names = sorted(set(hooks))
        message = (f"after the step, a backward through each of rank {r}'s {weights} weights still called a hook on "
                   f"{len(hooks)} of them ({', '.join(names[:3])}{' ...' if len(names) > 3 else ''}); ranks with "
                   f"hooks left: {[r for r, _ in left]}")
        return Check("hooks removed", False, message,
                     diagnosis=("the hooks the step registered are still on the weights, so the next step's backward "
                                "fires them again (on top of its own: every gradient all-reduced twice, or a handle "
                                "never waited for). Keep the handle each register_..._hook call returns and remove "
                                "them before returning (handle.remove())"))

    def diagnose_schedule(self, obs: Observation) -> str:
        """Why communication did not hide behind backward, read off rank 0's two streams."""
        if exposed_communication(obs, compute_ticks())[0] > compute_ticks() * COMPUTE_CAP[0] // COMPUTE_CAP[1]:
            return slow_compute(obs, compute_ticks())
        if max(sum(b for _, b in sent(obs, r).values()) for r in range(obs.world_size)) > COMMUNICATION_BUDGET:
            return "the ranks sent more than an all-reduce of the gradients (see communication), and it took longer"
        compute = sorted(obs.events_of(0, "compute"), key=lambda e: e["start"])
        backward = [e for e in compute if e["kind"] == "backward"]
        reduces = [e for e in obs.events_of(0, "comm") if e["kind"] != "recv" and e["nbytes"] > 8]  # not scalars
        if not reduces or not backward:
            return ("rank 0 communicated no gradient" if not reduces else
                    "rank 0 ran no backward on the compute stream")
        bwd_start, bwd_end = backward[0]["start"], max(e["end"] for e in backward)
        first = min(e["start"] for e in reduces)
        if first >= bwd_end:
            inside = [e for e in reduces if e["phase"] == "backward"]
            when = ("" if inside else ", and none was issued while backward ran")
            return (f"every gradient all-reduce started after backward had finished (the first at tick {first:,}; "
                    f"backward ended at tick {bwd_end:,}){when}, so nothing overlapped: compute + all "
                    f"communication. Issue each one from inside backward as soon as its gradient is ready (in the "
                    f"hook that fires then, register_post_accumulate_grad_hook), with async_op=True")
        idle = sum(max(0, b["start"] - a["end"]) for a, b in zip(compute, compute[1:])
                   if bwd_start <= b["start"] <= bwd_end)
        if idle >= weight_all_reduce_ticks():
            return (f"rank 0's compute stream sat idle {idle:,} ticks in the middle of backward while all-reduces "
                    f"ran: each all-reduce was waited for right after it was launched (or launched without "
                    f"async_op=True), so backward stopped for every message. Keep the handles and wait for them "
                    f"all after backward")
        tail = max(e["end"] for e in reduces) - bwd_end
        return (f"the all-reduces did start during backward, but {tail:,} ticks of communication were still "
                f"running after backward ended (more than one block's worth): were most gradients sent in one "
                f"bucket at the end, or late?")


SPEC = Overlap()
