"""p17: the zero-bubble pipeline's figures against the formulas the puzzle states.

- F, B and W are the serial stage's, every op counted, as a learner splits the backward (closed forms below):
  W walks the stage again from its output, so B + W is 3 matmuls more than the whole backward BW.
- With free messages, the last stage idles exactly (p-1)·F under ZB-H1 (it waits for its first activation, then
  never again), within (p-1)·max(F, B, F + B - W); exactly (p-1)·(F + BW) under 1F1B; about (p-1)·(F + B) with
  the split and no W deferred; and exactly (p-1)·(F + B - W) with Megatron-LM's WeightGradStore split (W < F).
  The budget is under a third of 1F1B's.
- ZB-H1 holds p microbatches on every rank, as 1F1B's rank 0 does: within 1F1B's rank-0 bound and the p inputs a
  later rank receives.
- The text schedule draws the W's labelled so (record_function("W3")) as W.
- The bubble's hint reads where the W's ran off the W's each rank held at each send (right after each B, or all
  after the last B), and gives none it cannot read. B before W reads a backward written by hand (outside autograd)
  off all the compute less the forwards', alike on the simulator and on gloo, and says when it cannot tell.
"""

import copy

from grader.backends.learner_code import load_module
from grader.backends.simulator import grade_file, observe_module
from grader.frontends.targets import REPO
from grader.frontends.timeline import schedule_text
from grader.specs import SPECS
from grader.specs.common.costs import copy as copy_cost
from grader.specs.p17_zero_bubble.spec import MEMORY, static_bytes
from grader.specs.p6_one_f_one_b.spec import ACT, WORKSPACE
from grader.specs.common.pipeline_values import BACKWARD, COST, FORWARD, LOSS_BACKWARD, LOSS_FORWARD, B, D, H, M, MB, P
from grader.specs.p17_zero_bubble.costs import (B_COST, F_COST, LAST_B, LAST_F, LAST_W, ONE_F_ONE_B_IDLE, SLACK,
                                                STAGE_WORK, W_COST, ZB_IDLE)
from puzzles.sim import CostModel

REFERENCE = REPO / "solutions" / "p17_zero_bubble.py"
ONE_F_ONE_B = REPO / "tests" / "naive" / "p17_zero_bubble.py"
NOT_DEFERRED = REPO / "tests" / "wrong" / "p17_w_right_after_b.py"
WEIGHT_GRADIENT_STORE = REPO / "tests" / "alternatives" / "p17_weight_gradient_store.py"
FREE = CostModel(latency_ticks=0, bytes_per_tick=None)
F, B_, W = F_COST.ticks, B_COST.ticks, W_COST.ticks


def observe(path, cost=None):
    spec = copy.copy(SPECS["p17"])
    spec.cost = cost or spec.cost
    return observe_module(spec, load_module(path), spec.make_inputs(0), 0)


def test_the_split_costs_every_op_counted():
    product, gelu, add = 2 * MB * D * H, MB * H, MB * D
    assert F_COST.flops == 4 * product + 2 * gelu + 2 * add == FORWARD.flops
    assert B_COST.flops == 4 * product + 2 * gelu + 2 * add  # the input path: 2 matmuls a block, gelu', the add
    assert W_COST.flops == 7 * product + 2 * gelu + add + 4 * D * H  # the path again but for one matmul; w.grad +=
    assert B_COST.flops + W_COST.flops - BACKWARD.flops == 3 * product + 2 * gelu + add  # walking the stage twice
    # the roofline: a matmul 260 ticks, a gelu 20, its backward 28, an add of [8, 64] 10, w.grad += 196
    assert (F, B_, W) == (4 * 260 + 2 * 20 + 2 * 10, 4 * 260 + 2 * 28 + 2 * 10, 7 * 260 + 2 * 28 + 10 + 4 * 196)
    loss = (LOSS_FORWARD.flops, LOSS_BACKWARD.flops)
    assert (LAST_F.flops - F_COST.flops, LAST_B.flops - B_COST.flops, LAST_W.flops - W_COST.flops) == \
        (loss[0], loss[1], loss[1])  # B and W both walk the loss's backward


def test_with_free_messages_the_idle_time_is_the_formula():
    returned = copy_cost(COST, B * D).ticks
    ours, theirs, split = observe(REFERENCE, FREE), observe(ONE_F_ONE_B, FREE), observe(NOT_DEFERRED, FREE)
    assert [ours.busy_ticks(r) for r in range(P)] == [STAGE_WORK[r].ticks + returned for r in range(P)]

    def idle(obs):
        return obs.makespan - obs.busy_ticks(P - 1)

    assert idle(ours) == (P - 1) * F == 3_300 <= ZB_IDLE == (P - 1) * max(F, B_, F + B_ - W)
    assert idle(theirs) == ONE_F_ONE_B_IDLE == (P - 1) * (F + BACKWARD.ticks) == 12_120
    assert abs(idle(split) - (P - 1) * (F + B_)) <= SLACK
    store = observe(WEIGHT_GRADIENT_STORE, FREE)
    # its W per microbatch, from what the last stage computed: m·(F + LF) + m·(B + LB) + m·W and the returned cat
    w_store = (store.busy_ticks(P - 1) - returned) // M - LAST_F.ticks - LAST_B.ticks
    assert w_store < F and idle(store) == (P - 1) * (F + B_ - w_store)  # the paper's formula, for W < F


def test_the_bubble_budget_is_under_a_third_of_1f1b_and_the_reference_within_it():
    budget = SPECS["p17"].budgets(None)["bubble"].value
    assert budget == ZB_IDLE + SLACK == 3_906 < ONE_F_ONE_B_IDLE // 3
    result = grade_file(SPECS["p17"], REFERENCE, seed=0)
    bubble = next(c for c in result.checks if c.name == "bubble")
    assert bubble.passed and bubble.measured <= ZB_IDLE


def test_zb_h1_holds_p_microbatches_on_every_rank_within_1f1b_and_the_inputs_received():
    obs = observe(REFERENCE)
    held = [obs.peak_bytes[r] - static_bytes(r) for r in range(P)]
    assert MEMORY == P * ACT + WORKSPACE + P * MB * D * 8  # puzzle 6's rank-0 bound and p received inputs
    assert max(held) <= MEMORY
    one_f_one_b = grade_file(SPECS["p6"], REPO / "solutions" / "p6_one_f_one_b.py", seed=0)
    rank0 = next(c for c in one_f_one_b.checks if c.name == "stage-0 activation memory").measured
    assert held[0] <= rank0 + P * MB * D * 8  # rank 0: 1F1B's, and the output gradients kept for W


def test_the_text_schedule_draws_the_labelled_w_as_w():
    result = grade_file(SPECS["p17"], REFERENCE, seed=0)
    text = schedule_text(result)
    rows = [line for line in text.splitlines() if "compute |" in line]
    assert len(rows) == P and all("W" in row and "B" in row and "F" in row for row in rows), text


def check_of(path, name):
    return next(c for c in grade_file(SPECS["p17"], path, seed=0).checks if c.name == name)


def test_the_bubble_hint_reads_where_the_ws_ran():
    """Deferring no W and deferring every W past the last B leave the same bubble, (p-1)·(F + B): the hint reads
    which it was off the W's each rank held at each send, and says nothing it cannot read."""
    after_each_b = check_of(NOT_DEFERRED, "bubble")
    assert "each W ran right after its B" in after_each_b.diagnosis
    for at_the_end in ("p17_every_w_after_the_last_b.py", "p17_every_w_at_the_end.py"):
        bubble = check_of(REPO / "tests" / "wrong" / at_the_end, "bubble")
        assert not bubble.passed and "right after its B" not in bubble.diagnosis
        assert "every W ran after the last B" in bubble.diagnosis and "all 8 W's" in bubble.diagnosis


def test_b_before_w_reads_a_hand_written_backward():
    """A backward of the learner's own products runs outside autograd: its order is read off all the compute less
    the forwards', so the weight gradients before the send are late and the right order still passes."""
    late = check_of(REPO / "tests" / "wrong" / "p17_hand_written_weights_before_send.py", "B before W")
    assert not late.passed and "2,102,272 FLOPs beyond its forwards" in late.message
    assert "the backward was not split (y.backward(g)" not in late.diagnosis  # no autograd call to name
    right = check_of(REPO / "tests" / "alternatives" / "p17_hand_written_backward.py", "B before W")
    assert right.passed and right.message.startswith("every input gradient")


def test_b_before_w_says_when_it_cannot_tell(tmp_path):
    """Every activation's receive posted at once, and the first microbatch's weight gradients before its send: the
    forwards run by then cannot be told from the weight gradients, so the check says it could not tell, not ok."""
    source = (REPO / "tests" / "alternatives" / "p17_hand_written_backward.py").read_text()
    edits = [("        nf = 0\n", "        nf = 0\n        inputs = [torch.empty(micro_shape, dtype=torch.float64) "
              "for _ in range(n_micro)] if rank > 0 else []\n        arriving = [dist.irecv(a, rank - 1) for a in "
              "inputs]\n"),
             ("                    a = torch.empty(micro_shape, dtype=torch.float64)\n"
              "                    dist.recv(a, rank - 1)\n",
              "                    arriving[i].wait()\n                    a = inputs[i]\n"),
             ("                if rank > 0:\n                    pend_grad.append(dist.isend(dx, rank - 1))\n",
              "                if i == 0:\n                    _bwd_weights(layers, store)\n                    store = "
              "None\n                if rank > 0:\n                    pend_grad.append(dist.isend(dx, rank - 1))\n"),
             ("                w_q.append((i, store))\n",
              "                if store is not None:\n                    w_q.append((i, store))\n")]
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    answer = tmp_path / "p17_zero_bubble.py"
    answer.write_text(source)
    order = check_of(answer, "B before W")
    assert order.message.startswith("not judged: rank 1") and "Could not tell" in order.message
