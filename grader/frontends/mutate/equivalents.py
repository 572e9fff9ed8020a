"""The reviewed list of equivalent mutants: mutants that survive because they are not wrong answers.

Each entry is keyed by what stays put when the file is edited: the puzzle, the operator, the reference's line
(stripped) and what the mutant made of it (stripped; "" when the line is gone), plus `occurrence` when the same
line text appears more than once in the file. Never by line number. Each entry says why the mutant computes the
same thing, with the same memory and time, or why no rule of the puzzle forbids the difference. A mutant on this
list that the grader kills is reported (the grader rejects a correct answer, or the entry is wrong).

Instructors add entries for their own puzzles in a JSON file (a list of objects with these fields), passed with
`python -m grader mutate --equivalents FILE`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .source import Mutant


P20_LOOP = "for start in range(0, rows.shape[0], MICRO):  # as many microbatches as this rank has: no collective inside"


@dataclass(frozen=True)
class Equivalent:
    puzzle: str
    operator: str
    line: str
    mutant: str
    reason: str
    occurrence: int | None = None  # None: every line with this text

    def matches(self, m: Mutant) -> bool:
        return (self.puzzle, self.operator, self.line, self.mutant) == (m.puzzle, m.operator, m.line, m.mutant) and (
            self.occurrence is None or self.occurrence == m.occurrence)


def reason_for(mutant: Mutant, entries) -> str:
    return next((e.reason for e in entries if e.matches(mutant)), "")


def load(path: Path) -> list[Equivalent]:
    """Entries from a JSON file: [{"puzzle", "operator", "line", "mutant", "reason", "occurrence"?}, ...]."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of equivalent mutants")
    fields = {"puzzle", "operator", "line", "mutant", "reason", "occurrence"}
    out = []
    for i, item in enumerate(data):
        missing = {"puzzle", "operator", "line", "mutant", "reason"} - set(item)
        if missing or set(item) - fields:
            raise ValueError(f"{path}: entry {i} needs the fields puzzle, operator, line, mutant and reason "
                             f"(and may give occurrence); it has {sorted(item)}")
        out.append(Equivalent(**item))
    return out


# The reviewed list. For each entry the run measured the same peak memory on every rank and the same makespan as
# the reference (bench/MUTATION.md), and the grader's real torch.distributed backend passes the mutant too.
_SYMMETRIC_LOSS = ("loss_fn is the squared error ((y - target)**2).sum(dim=1).mean(), symmetric in its two "
                   "arguments: the same loss, and the same gradient flows back through y")
_GRAD_MODE_ON = ("the grader calls the backward function with grad mode on (outside any no_grad, as a training loop "
                 "would), so torch.enable_grad() around the recomputation changes nothing")
_LEAF_ALREADY = ("x does not require grad, so its chunk is already a leaf; requires_grad_() on it makes the same "
                 "leaf detach() would (a view either way, no copy)")
_SEND_COPIES = "a send copies the values; whether the tensor sent carries a graph changes nothing on either rank"
_ACTIVATION_RECEIVED = ("the next rank has received this activation before it can send its gradient back, so the "
                        "isend's wait() is instant wherever it stands after the forward: the same makespan and peaks")
_COOL_DOWN_W = ("in the cool-down a W run after one more B fills a gap the rank would wait in anyway: the same "
                "makespan and peaks, measured")
# p11's build_3d_groups, as the mutator unparses it with two coordinates of one comprehension swapped
_LAYOUT_LINE = "layouts = {  # every group of each kind, in the same order on every rank"
_LAYOUT_TP = ("layouts = {'tp': [[at(dp, pp, tp) for tp in range(T)] for pp in range(P) for dp in range(D)], "
              "'dp': [[at(pp, dp, tp) for dp in range(D)] for pp in range(P) for tp in range(T)], "
              "'pp': [[at(pp, dp, tp) for pp in range(P)] for dp in range(D) for tp in range(T)]}")
_LAYOUT_PP = ("layouts = {'tp': [[at(pp, dp, tp) for tp in range(T)] for pp in range(P) for dp in range(D)], "
              "'dp': [[at(pp, dp, tp) for dp in range(D)] for pp in range(P) for tp in range(T)], "
              "'pp': [[at(pp, tp, dp) for pp in range(P)] for dp in range(D) for tp in range(T)]}")

EQUIVALENTS: tuple[Equivalent, ...] = (
    Equivalent("p1", "drop-grad-mode",
               'with torch.enable_grad(), torch.profiler.record_function("recompute"):  # the label shows on the chart',
               'with torch.profiler.record_function("recompute"):  # the label shows on the chart', _GRAD_MODE_ON),
    Equivalent("p1", "drop-detach", "start = saved[s].detach().requires_grad_()", "start = saved[s].requires_grad_()",
               "the checkpoints were made under no_grad, so each is a leaf already and requires_grad_() on it is "
               "what detach() would give, except that its gradient then stays in the checkpoint's .grad until the "
               "backward returns: +2·C (131,072 bytes) at the peak, measured, inside the stated peak budget of "
               "5,505,024 bytes; no rule of the puzzle asks for the checkpoints' gradients to go sooner"),
    Equivalent("p1", "drop-free", "del start, out", "",
               "start and out are rebound in the next iteration; until then `out` is one C-byte output whose graph "
               "backward already freed, alive during the next recomputation, which is not where the peak is"),
    Equivalent("p2", "drop-grad-mode", "with torch.enable_grad():", "", _GRAD_MODE_ON),
    Equivalent("p2", "drop-free",
               "del full, start, out  # the gathered checkpoint and the segment's graph go before the next gather", "",
               "the previous gathered checkpoint then lives until the next one is gathered: two at once, which the "
               "puzzle allows ('gathered checkpoints: 2·C, the checkpoint being gathered and at most the previous "
               "one'); the peak is elsewhere"),
    Equivalent("p3", "swap-statements", "dist.all_reduce(w.grad)", "w.grad /= world",
               "dividing by 4 before summing gives the same bits as dividing the sum (a power of two scales "
               "exactly); the same ops, memory and time"),
    Equivalent("p3", "in-place", "w.grad /= world", "w.grad = w.grad / world",
               "w.grad becomes a new tensor with the same values and the old one is freed at once; a transient of "
               "one gradient, not at the peak"),
    Equivalent("p3", "swap-args", "loss = loss_fn(forward(x_shard, layers), target_shard)",
               "loss = loss_fn(target_shard, forward(x_shard, layers))", _SYMMETRIC_LOSS),
    Equivalent("p4", "drop-clone", "grad = grad.clone()", "grad = grad",
               "the gradient arriving in f's backward is fresh (the matmul's backward made it) and nothing else reads "
               "it, so all-reducing it in place computes the same, with one buffer less"),
    Equivalent("p4", "drop-clone", "total = partial.clone()", "total = partial",
               "`partial` (a @ w2) is fresh and autograd does not save it (a matmul saves its inputs), so "
               "all-reducing it in place computes the same, with one buffer less: Megatron's own g does this"),
    Equivalent("p5", "drop-detach", "a = x.chunk(n_micro)[i].detach()", "a = x.chunk(n_micro)[i]", _LEAF_ALREADY),
    Equivalent("p5", "drop-detach", "dist.send(y.detach(), dst=rank + 1)", "dist.send(y, dst=rank + 1)",
               _SEND_COPIES),
    Equivalent("p5", "drop-free", "inputs[i] = outputs[i] = None  # microbatch i's activations can go", "",
               "GPipe's peak is at the end of the forwards, before this line first runs; keeping the finished "
               "microbatches (their graphs already freed by backward) only frees them later"),
    Equivalent("p5", "swap-args", "y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro",
               "y = loss_fn(target.chunk(n_micro)[i], y) / n_micro", _SYMMETRIC_LOSS),
    Equivalent("p5", "reverse-order",
               "for i in reversed(range(n_micro)):  # all backwards, the newest microbatch first (every rank in the "
               "same order)",
               "for i in range(n_micro):  # all backwards, the newest microbatch first (every rank in the same order)",
               "the backwards in forward order on every rank: the puzzle asks for an order both neighbours agree "
               "on; the same schedule length and peak, the gradients summed in another order (equal to rounding)"),
    Equivalent("p6", "off-by-one", "warmup = min(world - 1 - rank, n_micro)",
               "warmup = min(world - 1 - rank, n_micro + 1)",
               "for the puzzle's sizes (p = 4, m = 8) min() picks world - 1 - rank <= 3 either way; the text fixes "
               "m = 8, and the two differ only when m < p"),
    Equivalent("p6", "off-by-one", "warmup = min(world - 1 - rank, n_micro)",
               "warmup = min(world - 1 - rank, n_micro - 1)",
               "for the puzzle's sizes (p = 4, m = 8) min() picks world - 1 - rank <= 3 either way; the text fixes "
               "m = 8, and the two differ only when m <= p - 1"),
    Equivalent("p6", "off-by-one", "a, _ = exchange(send_next=y, recv_prev=i + 1 < n_micro)",
               "a, _ = exchange(send_next=y, recv_prev=i + 1 <= n_micro)",
               "in the warm-up i < p - 1 = 3, so i + 1 < m and i + 1 <= m are both true for the puzzle's m = 8"),
    *(Equivalent("p6", "swap-statements", line, after,
                 "batch_isend_irecv posts every op of its list together; their order in the list changes nothing")
      for line, after in (("if send_next is not None and not last:", "if send_prev is not None and not first:"),
                          ("if send_prev is not None and not first:", "if recv_prev and not first:"),
                          ("if recv_prev and not first:", "if recv_next and not last:"))),
    Equivalent("p6", "drop-detach", "a = (x.chunk(n_micro)[i].detach() if first else a).requires_grad_()",
               "a = (x.chunk(n_micro)[i] if first else a).requires_grad_()", _LEAF_ALREADY),
    Equivalent("p6", "drop-detach", "return y.detach()", "return y",
               "forward_step's return value is only ever sent (the last stage sends nothing); " + _SEND_COPIES),
    Equivalent("p6", "swap-args", "y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro",
               "y = loss_fn(target.chunk(n_micro)[i], y) / n_micro", _SYMMETRIC_LOSS),
    Equivalent("p6", "reverse-order", "for _ in range(warmup):  # cool-down: the backwards left over",
               "for _ in reversed(range(warmup)):  # cool-down: the backwards left over",
               "the loop variable is unused: the loop body runs warmup times either way"),
    Equivalent("p7", "swap-statements", "for work in pending:", "for h in hooks:",
               "every hook has fired by the time backward returns; removing them before or after the waits "
               "changes nothing"),
    Equivalent("p7", "swap-args", "loss_fn(forward(x_shard, layers), target_shard).backward()",
               "loss_fn(target_shard, forward(x_shard, layers)).backward()", _SYMMETRIC_LOSS),
    Equivalent("p8", "swap-statements", "dist.all_gather_into_tensor(flat, self.master)", "offset = 0",
               "offset is first read after the gather: the two statements are independent"),
    Equivalent("p8", "drop-grad-mode", "with torch.no_grad():", "",
               "without no_grad the master shard records a graph (cat, slice, clone) that saves no tensor; its "
               "values are the same and every later update runs under no_grad", occurrence=1),
    Equivalent("p8", "in-place", "g /= dist.get_world_size()", "g = g / dist.get_world_size()",
               "g becomes a new shard-sized tensor with the same values, the old one freed at once; a transient, "
               "not at the peak"),
    *(Equivalent("p8", "in-place", "denom = (self.v / (1 - beta2 ** self.t)).sqrt_().add_(self.eps)", after,
                 "denom is a temporary either way; the out-of-place op makes one more shard-sized temporary, freed "
                 "by the next op, not at the peak")
      for after in ("denom = (self.v / (1 - beta2 ** self.t)).sqrt_().add(self.eps)",
                    "denom = (self.v / (1 - beta2 ** self.t)).sqrt().add_(self.eps)")),
    Equivalent("p8", "drop-free", "del flat_grad", "",
               "the flat gradient then lives until step() returns instead of until the reduce-scatter is done: "
               "+8Ψ (65,536 bytes) during the update, measured, and freed when step() returns, as the text asks "
               "(\"free everything else before returning\"); the optimizer state the puzzle budgets is unchanged"),
    Equivalent("p8", "drop-free", "del flat", "",
               "the flat copy of the weights then lives until __init__ returns, while the moments are allocated; "
               "the peak is in step(), not here"),
    Equivalent("p11", "swap-statements", "dist.all_reduce(w.grad, group=dp)", "w.grad /= replicas",
               "dividing by 2 before summing gives the same bits as dividing the sum (a power of two scales "
               "exactly); the same ops, memory and time (measured: the reference's peaks and its makespan, 15,516 "
               "ticks)"),
    Equivalent("p11", "in-place", "w.grad /= replicas", "w.grad = w.grad / replicas",
               "w.grad becomes a new tensor with the same values and the old one is freed at once: a transient of "
               "one gradient after the pipeline, not at the peak (measured: the reference's peaks)"),
    Equivalent("p11", "drop-detach", "a = x.chunk(n_micro)[i].detach()", "a = x.chunk(n_micro)[i]", _LEAF_ALREADY),
    Equivalent("p11", "drop-detach", "dist.send(y.detach(), dst=peers[stage + 1])",
               "dist.send(y, dst=peers[stage + 1])", _SEND_COPIES),
    Equivalent("p11", "drop-clone", "grad = grad.clone()", "grad = grad",
               "the gradient arriving in f's backward is fresh (the matmul's backward made it) and nothing else reads "
               "it, so all-reducing it in place computes the same, with one buffer less (as in p4)"),
    Equivalent("p11", "drop-clone", "total = partial.clone()", "total = partial",
               "`partial` (a @ w2_r) is fresh and autograd does not save it (a matmul saves its inputs), so "
               "all-reducing it in place computes the same, with one buffer less (as in p4)"),
    Equivalent("p11", "drop-free", "inputs[i] = outputs[i] = None", "",
               "GPipe's peak is at the end of the forwards, before this line first runs; keeping the finished "
               "microbatches (their graphs already freed by backward) only frees them later (measured: the same "
               "peak on every rank, 1,351,720 bytes at most, and the same makespan)"),
    Equivalent("p11", "swap-args", "y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro",
               "y = loss_fn(target.chunk(n_micro)[i], y) / n_micro", _SYMMETRIC_LOSS),
    Equivalent("p11", "reverse-order",
               "for i in reversed(range(n_micro)):  # all backwards, newest first on every stage",
               "for i in range(n_micro):  # all backwards, newest first on every stage",
               "the backwards in forward order on both stages: the puzzle asks for an order both neighbours agree "
               "on (GPipe's order is the lesson, not a rule); the same schedule length and peak, the gradients "
               "summed in another order (equal to rounding)"),
    *(Equivalent("p11", "swap-args", _LAYOUT_LINE, mutant,
                 "with P = D = T = 2 the swapped coordinates range over the same values, so the comprehension makes "
                 "the same groups, in another order that is the same on every rank: every rank still calls "
                 "new_group for every group in one agreed order and gets the same three groups back")
      for mutant in (_LAYOUT_TP, _LAYOUT_PP)),
    Equivalent("p12", "swap-statements", "dist.all_to_all_single(received_counts, sent_counts)",
               "send_splits = sent_counts.view(world, local).sum(1).tolist()",
               "send_splits is read off this rank's own counts, which the exchange does not change: computing it "
               "before the counts' all-to-all or after is the same"),
    Equivalent("p14", "drop-clone", "grad = grad.clone()", "grad = grad",
               "the gradient a norm weight's hook receives is fresh (rms_norm's last multiply made it), and each norm "
               "weight is used once, so nothing else reads it: all-reducing it in place computes the same, with one "
               "[d] buffer less (as p4's f); the activation memory, measured after the forward, is the same"),
    Equivalent("p10", "drop-free", "del grad_w1, grad_w2", "",
               "a layer's two full weight gradients then live until the next layer's backward rebinds them, beside "
               "the flat copy being reduce-scattered: +65,536 bytes at rank 0's peak, measured, the same makespan. "
               "p10's rules budget the weights (the gathered buffers, and everything the forward holds), not the "
               "backward's gradient buffers: no stated rule forbids it"),
    Equivalent("p16", "off-by-one", "warmup = min((world - rank - 1) * 2 + (v - 1) * world, units)",
               "warmup = min((world - rank - 1) * 2 + (v - 1) * world, units + 1)",
               "for the puzzle's sizes (p = 4, v = 2, m = 8) min() picks the warm-up, at most 10, either way: the "
               "m·v = 16 units cap it only when m is smaller than the text fixes"),
    Equivalent("p16", "off-by-one", "warmup = min((world - rank - 1) * 2 + (v - 1) * world, units)",
               "warmup = min((world - rank - 1) * 2 + (v - 1) * world, units - 1)",
               "for the puzzle's sizes (p = 4, v = 2, m = 8) min() picks the warm-up, at most 10, either way: the "
               "m·v = 16 units cap it only when m is smaller than the text fixes"),
    Equivalent("p16", "swap-statements", "dist.recv(g, src=(rank + 1) % world)",
               "activation_sends.pop((c, i)).wait()  # its gradient is back: the next rank had the activation",
               _ACTIVATION_RECEIVED),
    Equivalent("p16", "swap-statements",
               "activation_sends.pop((c, i)).wait()  # its gradient is back: the next rank had the activation",
               "y.backward(g)", _ACTIVATION_RECEIVED),
    Equivalent("p16", "drop-detach", "a = x.chunk(n_micro)[i].detach()", "a = x.chunk(n_micro)[i]", _LEAF_ALREADY),
    Equivalent("p16", "drop-detach", "activation_sends[c, i] = dist.isend(y.detach(), (rank + 1) % world)",
               "activation_sends[c, i] = dist.isend(y, (rank + 1) % world)", _SEND_COPIES),
    Equivalent("p16", "swap-args", "y = loss_fn(y, target.chunk(n_micro)[i]) / n_micro",
               "y = loss_fn(target.chunk(n_micro)[i], y) / n_micro", _SYMMETRIC_LOSS),
    Equivalent("p17", "off-by-one", "warmup = min(world - 1 - rank, n_micro)",
               "warmup = min(world - 1 - rank, n_micro + 1)",
               "for the puzzle's sizes (p = 4, m = 8) min() picks world - 1 - rank <= 3 either way"),
    Equivalent("p17", "off-by-one", "warmup = min(world - 1 - rank, n_micro)",
               "warmup = min(world - 1 - rank, n_micro - 1)",
               "for the puzzle's sizes (p = 4, m = 8) min() picks world - 1 - rank <= 3 either way"),
    Equivalent("p17", "off-by-one", "if len(waiting) > rank:", "if len(waiting) >= rank:",
               "rank r defers r - 1 W's in the steady state instead of r: a schedule between 1F1B and ZB-H1 whose "
               "last stage idles 3,715 ticks, measured, within the stated budget of 3,906 (and under a third of "
               "1F1B's 12,120); it holds fewer microbatches. The rules are the bubble and the memory, not ZB-H1's "
               "exact order", occurrence=1),
    Equivalent("p17", "off-by-one", "if len(waiting) > rank:", "if len(waiting) >= rank:", _COOL_DOWN_W,
               occurrence=2),
    Equivalent("p17", "drop-guard", "if len(waiting) > rank:", "if True:", _COOL_DOWN_W, occurrence=2),
    Equivalent("p17", "swap-statements", "while waiting:  # the deferred W's, in what was 1F1B's bubble",
               "for work in gradient_sends:",
               "the last input gradient a rank sends is received by the rank before it at once (it waits for "
               "nothing else by then), so waiting for the sends before the deferred W's or after takes the same "
               "time: the same makespan and peaks, measured"),
    Equivalent("p17", "swap-statements", "dist.recv(g, src=rank + 1)",
               "activation_sends.pop(i).wait()  # its gradient is back: the next rank had the activation",
               _ACTIVATION_RECEIVED),
    Equivalent("p17", "drop-detach", "a = x.chunk(n_micro)[i].detach()", "a = x.chunk(n_micro)[i]", _LEAF_ALREADY),
    Equivalent("p17", "drop-detach", "activation_sends[i] = dist.isend(y.detach(), rank + 1)",
               "activation_sends[i] = dist.isend(y, rank + 1)", _SEND_COPIES),
    Equivalent("p17", "reverse-order", "i, g = waiting.popleft()", "i, g = waiting.pop()",
               "each W takes its own microbatch's output gradient with it from the queue, so the deferred W's run "
               "in another order with the same pairs: the same weight gradients (summed in another order, equal to "
               "rounding), every W still after its B; the same makespan and peaks, measured"),
    Equivalent("p18", "off-by-one", "setattr(state, key, whole[lo - first:hi - first].clone())",
               "setattr(state, key, whole[lo - first:hi - first + 1].clone())",
               "the saved shards read are exactly those that overlap [lo, hi), and with 4 and 2 ranks their ends meet "
               "hi: hi - first is the length of `whole`, so a slice one further ends at the same place"),
    Equivalent("p18", "drop-clone", "setattr(state, key, whole[lo - first:hi - first].clone())",
               "setattr(state, key, whole[lo - first:hi - first])",
               "the slice is the whole of `whole`, a fresh tensor torch.cat made for it (see the off-by-one entry): "
               "a view of it holds nothing more than the copy would"),
    Equivalent("p18", "drop-guard", "if rank == 0:", "if True:",
               "every rank makes the step's folder with exist_ok=True: one makes it, the others find it there "
               "(os.makedirs(exist_ok=True) is safe against that race on a real disk too); nothing is written twice",
               occurrence=1),
    Equivalent("p18", "swap-statements", "dist.barrier()  # the folder exists before any rank writes into it",
               "buffer = io.BytesIO()",
               "an empty in-memory buffer made before the barrier rather than after it: nothing reaches the disk "
               "before the barrier either way"),
    Equivalent("p18", "reverse-order",
               "for i in range(lo // size, (hi - 1) // size + 1):  # the saved shards that hold a part of mine",
               "for i in reversed(range(lo // size, (hi - 1) // size + 1)):  # the saved shards that hold a part "
               "of mine",
               "the shards are read into a dict by their number and joined in sorted order; a damaged one ends "
               "the loop whichever is read first: the same checkpoint, the same state"),
    Equivalent("p15", "swap-statements",
               "theirs = load_balanced_chunks((rank - step) % world, world)  # the chunks of the block I hold",
               "if step < world - 1:  # the next block arrives while I compute with this one",
               "which chunks the block holds is a pure function of the step, not of the exchange: reading it before "
               "or after posting the messages is the same"),
    Equivalent("p15", "swap-statements", "theirs = load_balanced_chunks((rank - step) % world, world)",
               "if step < world - 1:", "the same in backward: the block's chunks do not depend on the exchange"),
    Equivalent("p15", "swap-statements", "if step < world - 1:",
               "dk, dv = torch.zeros_like(k), torch.zeros_like(v)  # this block's gradient from my queries",
               "zeroing this step's dk and dv before posting the exchange or after it: independent, the same values, "
               "bytes and times (measured: the same peak and makespan)", occurrence=2),
    Equivalent("p15", "swap-statements", "if step == 0:", "if step < world - 1:",
               "waiting for the next K/V block (long arrived: it travelled while the tiles were computed) before "
               "sending this block's dK/dV on instead of after: the same values and bytes, the same makespan and "
               "peak (measured)"),
    Equivalent("p15", "swap-statements",
               "leaving = [dist.isend(dk, right), dist.isend(dv, right)]  # on; after the last step, home",
               "arriving_grad = (torch.empty_like(k), torch.empty_like(v))",
               "allocating the next receive buffer before sending dK/dV on instead of after: empty_like makes no "
               "kernel and the send reads dk and dv only; the same values, bytes, peak and makespan (measured)"),
    *(Equivalent("p15", "in-place", f"d{x} += arriving_grad[{i}]", f"d{x} = d{x} + arriving_grad[{i}]",
                 f"d{x} is this step's fresh buffer, then only sent on: adding into a new tensor instead of into it "
                 f"sends the same sum (no view of it is used afterwards); the same peak and makespan (measured)")
      for i, x in enumerate("kv")),
    *(Equivalent("p15", "drop-free", line, "",
                 "on the simulator a handle lets go of its buffer once waited for, so dropping the finished handles "
                 "frees nothing sooner there; the line is for gloo, whose handles keep their buffers (it keeps the "
                 "two backends' ledgers the same, tests/test_real_backend.py)")
      for line in ("grad_works = None  # a finished handle may still hold its buffer (gloo's do): let them go",
                   "del grad_works, leaving")),
    Equivalent("p15", "swap-args", "total = torch.logaddexp(lse, tile_lse)", "total = torch.logaddexp(tile_lse, lse)",
               "logaddexp is symmetric in its arguments"),
    Equivalent("p15", "swap-args", "return t.view(b, s, n_heads, d // n_heads).transpose(1, 2).contiguous()",
               "return t.view(b, s, n_heads, d // n_heads).transpose(2, 1).contiguous()",
               "transpose(1, 2) and transpose(2, 1) swap the same two dimensions"),
    Equivalent("p15", "swap-args", "return out.transpose(1, 2).reshape(b, s, d) @ wo",
               "return out.transpose(2, 1).reshape(b, s, d) @ wo",
               "transpose(1, 2) and transpose(2, 1) swap the same two dimensions"),
    *(Equivalent("p19", "off-by-one", "start, end = max(offset, lo), min(offset + p.numel(), lo + self.shard)", after,
                 "a slice of the shard clamps at its ends: the range one element wider on the outside selects the "
                 "same elements (g[-1:0] is empty, g[a:shard + 1] is g[a:shard]), so the same squares are added")
      for after in ("start, end = (max(offset, lo - 1), min(offset + p.numel(), lo + self.shard))",
                    "start, end = (max(offset, lo), min(offset + p.numel(), lo + self.shard + 1))")),
    Equivalent("p19", "off-by-one", "if start < end:", "if start <= end:",
               "a parameter that meets the shard at one point only adds an empty range: a sum of nothing, 0"),
    Equivalent("p19", "swap-statements",
               "dist.all_reduce(squares, group=self.tp_group)  # the pair's slices (and its replicated copies, halved)",
               "dist.all_reduce(squares, group=self.dp_group)  # the other replica's half of the parameters",
               "the sum over the data-parallel pair and then the tensor-parallel pair is the sum over the same four "
               "ranks in another order: the same norm to the last bits or so (1e-16 relative), the same bytes"),
    Equivalent("p19", "swap-statements", "dist.all_gather_into_tensor(flat, self.master, group=self.dp_group)",
               "offset = 0", "offset is first read after the gather: the two statements are independent"),
    Equivalent("p19", "drop-grad-mode", "with torch.no_grad():", "",
               "without no_grad the master shard records a graph (cat, slice, clone) that saves no tensor; its "
               "values are the same and every later update runs under no_grad (as p8's)", occurrence=1),
    *(Equivalent("p19", "in-place", line, after,
                 "the name is bound to a new tensor with the same values and the old one is freed at once: a "
                 "transient of one shard (or one number), between steps nothing more is kept")
      for line, after in (("g /= self.dp_size", "g = g / self.dp_size"),
                          ("squares += g[start:end].square().sum() * weight",
                           "squares = squares + g[start:end].square().sum() * weight"),
                          ("g *= torch.clamp(self.max_norm / (norm + 1e-6), max=1.0)",
                           "g = g * torch.clamp(self.max_norm / (norm + 1e-06), max=1.0)"))),
    *(Equivalent("p19", "in-place", "denom = (self.v / (1 - beta2 ** self.t)).sqrt_().add_(self.eps)", after,
                 "denom is a temporary either way; the out-of-place op makes one more shard-sized temporary, freed "
                 "by the next op (as p8's)")
      for after in ("denom = (self.v / (1 - beta2 ** self.t)).sqrt_().add(self.eps)",
                    "denom = (self.v / (1 - beta2 ** self.t)).sqrt().add_(self.eps)")),
    Equivalent("p19", "drop-free", "del flat_grad", "",
               "the flat gradient then lives until step() returns instead of until the reduce-scatter is done "
               "(+8·Ψ_r: the peak during the update, which p19 does not budget), and is freed when step() returns, "
               "as the text asks; the optimizer state kept between steps is unchanged"),
    Equivalent("p20", "off-by-one", P20_LOOP, P20_LOOP.replace("rows.shape[0], MICRO", "rows.shape[0] + 1, MICRO"),
               "when a rank's real rows are a multiple of 4, one more microbatch of no row: its loss is 0 and its "
               "backward adds zeros; no collective inside the loop, so the ranks' calls stay the same", occurrence=1),
    Equivalent("p20", "reverse-order", P20_LOOP, f"for start in reversed(range(0, rows.shape[0], MICRO)):  "
               f"{P20_LOOP.split(':  ', 1)[1]}",
               "the microbatches' gradients added into w.grad in the other order: the same sum, to rounding (1e-16)",
               occurrence=1),
    Equivalent("p20", "swap-statements", "dist.all_reduce(n)  # every rank's real rows: the loss is their mean",
               "total = torch.zeros((), dtype=torch.float64)",
               "two independent statements: the running loss starts at zero before or after the count is all-reduced",
               occurrence=1),
    Equivalent("p20", "swap-statements", "for w in weights:", "dist.all_reduce(total)",
               "the loss's all-reduce before the gradients' instead of after: every rank makes the same calls in "
               "the same order either way, and neither depends on the other", occurrence=1),
    Equivalent("p20", "swap-statements", "dist.all_reduce(total)", "with torch.no_grad():",
               "the loss's all-reduce after the update instead of before: the update reads only the gradients, and "
               "every rank makes the same calls in the same order", occurrence=1),
    Equivalent("p20", "drop-detach", "total += loss.detach()", "total += loss",
               "the running loss joins the graph, whose saved tensors backward has already freed: the same values "
               "and the same memory (the harness keeps a detached copy)", occurrence=1),
    Equivalent("p20", "in-place", "total += loss.detach()", "total = total + loss.detach()",
               "a scalar rebound to a new scalar with the same value", occurrence=1),
    Equivalent("p21", "swap-args", "loss = loss_fn(forward(x, layers), target)",
               "loss = loss_fn(target, forward(x, layers))", _SYMMETRIC_LOSS),
    Equivalent("p21", "drop-detach", "logged = loss.detach().clone()", "logged = loss.clone()",
               "the logged loss stays in its graph, whose saved tensors backward has already freed: the same values "
               "and the same memory, all-reduced in place all the same, and still no sync (the harness keeps a "
               "detached copy)"),
    Equivalent("p21", "drop-clone", "logged = loss.detach().clone()", "logged = loss.detach()",
               "the loss's own storage all-reduced in place: backward has already run, and nothing reads the loss "
               "again, so the logged value is the same with one 8-byte copy less"),
    Equivalent("p21", "swap-statements", "dist.all_reduce(logged)  # the whole batch's loss, for the log: 8 bytes, "
               "on the device, no sync", "losses.append(logged)",
               "the list holds the tensor itself, which the blocking all-reduce then writes in place: appended "
               "before or after, the list ends up with the same values", occurrence=1),
    Equivalent("p22", "drop-detach", "stats = torch.stack([per_row.detach().sum(), keep.sum()]).double()  # (exact "
               "sums, in any order)", "stats = torch.stack([per_row.sum(), keep.sum()]).double()  # (exact sums, in "
               "any order)",
               "the summed loss joins the graph through the stack, but backward reads only stats[1], the count, "
               "whose gradient reaches per_row as zeros: the same values and the same memory (a few ticks more)",
               occurrence=1),
    Equivalent("p23", "swap-args", "loss = loss_fn(forward(x, layers), target) * (hi - lo) / rows  # this rank's "
               "share of the batch's mean", "loss = loss_fn(target, forward(x, layers)) * (hi - lo) / rows  # this "
               "rank's share of the batch's mean", _SYMMETRIC_LOSS + " (72 ticks more in all, within the "
               "budget: the gradient reaches y through the subtraction's negated side, one elementwise op more)"),
)
