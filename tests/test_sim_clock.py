"""The simulated clock: every op on the roofline, messages by the ring formulas, each rank's communication in the
order it was issued, overlap of async communication, labels, and the same timeline on every run."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import record_function
from sim_helpers import site_in

from puzzles import sim
from puzzles.sim import PUZZLE_GPU, CostModel, DeviceProfile, OpCost

# A device whose figures are easy to follow by hand: 1 FLOP a tick, 1,000 bytes a tick, no launch cost.
EASY = DeviceProfile("easy", flops_per_tick=1, memory_bytes_per_tick=1000, launch_ticks=0)
COST = CostModel(latency_ticks=7, bytes_per_tick=3, device=EASY)


def matmul_ticks(m, k, n, cost=COST):
    """[m, k] @ [k, n] in float64 on the roofline: 2·m·k·n FLOPs, reading both and writing the product."""
    return cost.compute_ticks(OpCost(2 * m * k * n, (m * k + k * n + m * n) * 8))


# ---- the ring formulas


def ceil_div(a, b):
    return -(-a // b)


def ring_ticks(kind, nbytes, n, alpha=COST.latency_ticks, beta=COST.bytes_per_tick):
    """The issue's formulas, written out again here (not taken from CostModel)."""
    if kind in ("send", "recv"):
        return alpha + ceil_div(nbytes, beta)
    if n == 1:
        return 0
    if kind == "all_reduce":
        return 2 * (n - 1) * alpha + ceil_div(2 * (n - 1) * nbytes, n * beta)
    if kind in ("all_gather", "all_gather_into_tensor", "reduce_scatter_tensor"):
        return (n - 1) * alpha + ceil_div((n - 1) * nbytes, n * beta)
    if kind == "broadcast":
        return (n - 1) * alpha + ceil_div(nbytes, beta)
    assert kind == "barrier"
    return 2 * (n - 1) * alpha


def one_collective(kind, numel):
    """fn running one `kind` of `numel` float64 per rank on buffers the harness places (allocating costs ticks now,
    so the buffers come in as arguments); returns fn."""

    def fn(dist, x, gathered, scattered):
        if kind == "all_reduce":
            dist.all_reduce(x)
        elif kind == "all_gather":
            dist.all_gather(list(gathered.chunk(dist.get_world_size())), x)
        elif kind == "all_gather_into_tensor":
            dist.all_gather_into_tensor(gathered, x)
        elif kind == "reduce_scatter_tensor":
            dist.reduce_scatter_tensor(scattered, x)
        elif kind == "broadcast":
            dist.broadcast(x, src=0)
        else:
            dist.barrier()

    return fn


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
                                  "broadcast", "barrier"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_collective_ticks_follow_the_ring_formulas(n, kind):
    numel = 5 * n  # 40n bytes: the bandwidth terms do not divide evenly, so rounding up is tested too
    args = (torch.zeros(numel, dtype=torch.float64), torch.zeros(n * numel, dtype=torch.float64),
            torch.zeros(numel // n, dtype=torch.float64))
    result = sim.run(one_collective(kind, numel), n, args=args, cost=COST)
    full = numel * 8 * (n if kind in ("all_gather", "all_gather_into_tensor") else 1)
    expected = ring_ticks(kind, full, n)
    events = result.events_of(stream="comm")
    assert [(e.rank, e.kind, e.start, e.end) for e in events] == [(r, kind, 0, expected) for r in range(n)], events
    assert result.makespan == expected
    if kind != "barrier":
        assert all(e.nbytes == full for e in events), events


@pytest.mark.parametrize("numel", [1, 5, 13])
def test_point_to_point_ticks(numel):
    def fn(dist, x):
        (dist.send if dist.get_rank() == 0 else dist.recv)(x, 1 - dist.get_rank())

    result = sim.run(fn, 2, args=(torch.zeros(numel, dtype=torch.float64),), cost=COST)
    expected = ring_ticks("send", numel * 8, 2)
    got = [(e.rank, e.kind, e.start, e.end, e.peers) for e in result.events]
    assert got == [(0, "send", 0, expected, (0, 1)), (1, "recv", 0, expected, (0, 1))], got


def test_cost_model_formulas_match_the_written_out_ones():
    for n in (1, 2, 3, 4, 8):
        for nbytes in (1, 40, 1001):
            for kind in ("send", "all_reduce", "all_gather", "reduce_scatter_tensor", "broadcast", "barrier"):
                assert COST.comm_ticks(kind, nbytes, n) == ring_ticks(kind, nbytes, n), (kind, nbytes, n)


# ---- the roofline: every op costs max(FLOPs / rate, bytes / bandwidth) + a launch


def one_op(fn, *tensors, cost=COST):
    """The compute events of one rank that runs fn on its own copies of `tensors`."""
    result = sim.run(lambda dist, *ts: fn(*ts), 1, args=tensors, cost=cost)
    return result.events_of(0, "compute")


def test_a_matmul_is_bound_by_its_flops_and_an_elementwise_op_by_its_bytes():
    device = DeviceProfile("d", flops_per_tick=64, memory_bytes_per_tick=128, launch_ticks=5)
    cost = CostModel(device=device)
    a, b = torch.ones(16, 32, dtype=torch.float64), torch.ones(32, 8, dtype=torch.float64)
    (mm,) = one_op(lambda x, y: x @ y, a, b, cost=cost)
    flops, nbytes = 2 * 16 * 32 * 8, (16 * 32 + 32 * 8 + 16 * 8) * 8
    assert (mm.flops, mm.bytes, mm.op) == (flops, nbytes, "mm")
    assert mm.ticks == max(ceil_div(flops, 64), ceil_div(nbytes, 128)) + 5 == 133  # arithmetic: 128 > 56
    (gelu,) = one_op(F.gelu, a, cost=cost)
    n = 16 * 32
    assert (gelu.flops, gelu.bytes, gelu.op) == (n, 2 * n * 8, "gelu")
    assert gelu.ticks == max(ceil_div(n, 64), ceil_div(2 * n * 8, 128)) + 5 == 69  # memory: 64 > 8


def test_views_cost_nothing_and_a_reduction_counts_its_input():
    x = torch.ones(6, 10, dtype=torch.float64)
    assert one_op(lambda t: (t.t(), t.view(60), t[2:], t.unsqueeze(0).expand(3, 6, 10), t.detach()), x) == []
    (total,) = one_op(lambda t: t.sum(), x)
    assert (total.flops, total.bytes) == (60, 60 * 8 + 8)
    (mean,) = one_op(lambda t: t.mean(dim=1), x)
    assert (mean.flops, mean.bytes) == (60, 60 * 8 + 6 * 8)


def test_an_expanded_input_is_read_once():
    """A broadcast reads the small tensor once (its memory span), not once per element of the result."""
    row, col = torch.ones(1, 50, dtype=torch.float64), torch.ones(40, 1, dtype=torch.float64)
    (mul,) = one_op(lambda a, b: a * b, row, col)
    assert (mul.flops, mul.bytes) == (40 * 50, (50 + 40 + 40 * 50) * 8)


def test_half_precision_computes_as_fast_as_the_device_says():
    device = DeviceProfile("d", flops_per_tick=1024, memory_bytes_per_tick=1 << 20, launch_ticks=0,
                           half_precision_speedup=4)
    a32, a16 = torch.ones(64, 64, dtype=torch.float32), torch.ones(64, 64, dtype=torch.float16)
    (full,) = one_op(lambda a: a @ a, a32, cost=CostModel(device=device))
    (half,) = one_op(lambda a: a @ a, a16, cost=CostModel(device=device))
    assert full.flops == half.flops == 2 * 64 ** 3
    assert (full.ticks, half.ticks) == (2 * 64 ** 3 // 1024, 2 * 64 ** 3 // (1024 * 4))


def products_written_out(x, w):
    """The routes to x @ w that a matmul-only FLOP count does not see (measured at 0 FLOPs before issue 18)."""
    m, k = x.shape
    n = w.shape[1]
    yield "broadcast multiply + sum", lambda: (x[:, :, None] * w[None, :, :]).sum(1)
    yield "outer products", lambda: sum(torch.outer(x[:, j], w[j]) for j in range(k))
    yield "addr", lambda: sum(torch.addr(torch.zeros(m, n, dtype=x.dtype), x[:, j], w[j]) for j in range(k))
    yield "kron", lambda: sum(torch.kron(x[:, j:j + 1], w[j:j + 1]) for j in range(k))
    yield "mv per column", lambda: torch.stack([torch.mv(x, w[:, c]) for c in range(n)], 1)
    yield "dot per entry", lambda: torch.stack([torch.stack([torch.dot(x[i], w[:, c]) for c in range(n)])
                                                for i in range(m)])
    yield "vmap of outer", lambda: torch.vmap(torch.outer)(x.t(), w).sum(0)
    yield "einsum", lambda: torch.einsum("ik,kn->in", x, w)
    yield "bilinear", lambda: F.bilinear(x, torch.ones(m, 1, dtype=x.dtype),
                                         w.t().reshape(n, k, 1)).diagonal().t() if m == n else (x @ w)
    yield "index_add", lambda: torch.zeros(m, n, dtype=x.dtype).index_add_(
        0, torch.arange(m).repeat_interleave(k), (x.reshape(-1, 1) * w.repeat(m, 1)))
    yield "cumsum", lambda: (x[:, :, None] * w[None, :, :]).cumsum(1)[:, -1]


def test_every_route_to_a_product_costs_at_least_the_product_forward_and_backward():
    """Once every op counts, writing a product out of elements can only cost more: in FLOPs (what the compute
    checks count) and in time (every partial product goes to memory and back)."""
    m, k, n = 6, 5, 6
    x0 = torch.randn(m, k, dtype=torch.float64)
    w0 = torch.randn(k, n, dtype=torch.float64)

    def cost_of(route):
        def fn(x, w):
            x, w = x.requires_grad_(), w.requires_grad_()
            route_fn = dict(products_written_out(x, w))[route]
            route_fn().sum().backward()

        events = one_op(fn, x0, w0)
        return sum(e.flops for e in events), sum(e.ticks for e in events)

    baseline_flops, baseline_ticks = cost_of("einsum")
    assert baseline_flops >= 3 * 2 * m * k * n  # the product, and its two gradients
    for route, _ in products_written_out(x0, w0):
        flops, ticks = cost_of(route)
        assert flops >= 3 * 2 * m * k * n, (route, flops)
        assert ticks >= baseline_ticks * 0.9, (route, ticks, baseline_ticks)


@pytest.mark.parametrize("name, fn, least", [
    ("fft", lambda a: torch.fft.rfft(a, dim=1), 5 * 40 * 8 * 3),
    ("solve", lambda a: torch.linalg.solve(a[:, :8] @ a[:, :8].T + torch.eye(40, dtype=a.dtype), a), 2 * 40 ** 3),
    ("inverse", lambda a: torch.linalg.inv(a[:, :8] @ a[:, :8].T + torch.eye(40, dtype=a.dtype)), 2 * 40 ** 3),
    ("cdist", lambda a: torch.cdist(a, a), 3 * 40 * 40 * 8),
])
def test_ops_without_a_torch_formula_get_their_own(name, fn, least):
    events = one_op(fn, torch.randn(40, 8, dtype=torch.float64))
    assert sum(e.flops for e in events) >= least, (name, events)


@pytest.mark.parametrize("name, fn", [
    ("addmm_", lambda acc, a, b: acc.addmm_(a, b)),
    ("baddbmm_", lambda acc, a, b: acc[None].baddbmm_(a[None], b[None])),
    ("addbmm_", lambda acc, a, b: acc.addbmm_(a[None], b[None])),
])
def test_a_product_written_in_place_costs_what_the_product_costs(name, fn):
    """w.grad.addmm_(h.t(), dy) (a weight gradient added in place, as Megatron-LM's zero-bubble W does) is the
    product h.t() @ dy: its FLOPs count among the products, and it takes at least the product's time."""
    a, b = torch.randn(64, 8, dtype=torch.float64), torch.randn(8, 256, dtype=torch.float64)
    (plain,) = one_op(lambda a, b: a @ b, a, b)
    events = one_op(lambda acc, a, b: fn(acc, a, b), torch.zeros(64, 256, dtype=torch.float64), a, b)
    product = [e for e in events if name in e.op]
    assert product and product[0].flops == plain.flops == 2 * 64 * 8 * 256, (name, events)
    assert product[0].product_flops == plain.flops and product[0].ticks >= plain.ticks, (name, events)


def test_a_sparse_product_costs_two_flops_per_stored_value_and_column():
    dense = torch.randn(20, 7, dtype=torch.float64)
    (mm,) = [e for e in one_op(lambda d: torch.sparse.mm(torch.eye(20, dtype=d.dtype).to_sparse(), d), dense)
             if "mm" in e.op]
    assert mm.flops >= 2 * 20 * 7


def test_an_op_without_any_formula_is_refused_naming_it_and_the_line():
    """allowed.py: an op runs on a rank only if op_costs.py can charge it; anything else is refused, never charged
    a guess."""
    from puzzles.sim import UncostedOpError, op_cost

    class Unknown:  # an op the table does not know: a made-up overload with no tags
        overloadpacket = type("P", (), {"__name__": "made_up"})()
        is_view = False
        tags = ()

    a = torch.ones(10, dtype=torch.float64)
    with pytest.raises(UncostedOpError, match="made_up has no cost formula"):
        op_cost(Unknown(), (a, a), {}, torch.ones(30, dtype=torch.float64))

    def fn(dist):
        return torch.pdist(torch.ones(4, 3, dtype=torch.float64))  # no-formula

    with pytest.raises(UncostedOpError) as info:
        sim.run(fn, 1)
    text = str(info.value)
    assert "aten._pdist_forward has no cost formula" in text and site_in(__file__, "no-formula") in text, text
    assert "write it with ops that have one" in text


# ---- when things start


def test_a_collective_starts_when_its_last_participant_arrives():
    m = 6

    def fn(dist, a):
        for _ in range(dist.get_rank()):  # rank r arrives after r matmuls
            a = a @ a / m
        dist.all_reduce(a)
        return a @ a

    n = 4
    result = sim.run(fn, n, args=(torch.ones(m, m, dtype=torch.float64),), cost=COST)
    divide = COST.compute_ticks(OpCost(m * m, 2 * m * m * 8))
    step = matmul_ticks(m, m, m) + divide
    arrive = (n - 1) * step
    end = arrive + ring_ticks("all_reduce", m * m * 8, n)
    for r in range(n):
        (comm,) = result.events_of(r, "comm")
        assert (comm.start, comm.end, comm.issued) == (arrive, end, r * step), f"rank {r}: {comm}"
        last = result.events_of(r, "compute")[-1]  # the matmul after the sync all_reduce waits for it
        assert (last.start, last.end) == (end, end + matmul_ticks(m, m, m)), f"rank {r}: {last}"
    assert result.makespan == end + matmul_ticks(m, m, m)


@pytest.mark.parametrize("numel, m", [(300, 4), (30, 12), (30, 40)])
def test_async_all_reduce_overlaps_compute_by_what_the_cost_model_predicts(numel, m):
    def fn(dist, grad, a, overlap):
        if overlap:
            work = dist.all_reduce(grad, async_op=True)
            a @ a
            work.wait()
        else:
            dist.all_reduce(grad)
            a @ a
        return grad

    comm = COST.comm_ticks("all_reduce", numel * 8, 2)
    compute = matmul_ticks(m, m, m)
    serial, overlapped = (sim.run(fn, 2, args=(torch.ones(numel, dtype=torch.float64),
                                               torch.ones(m, m, dtype=torch.float64), overlap), cost=COST)
                          for overlap in (False, True))
    assert serial.makespan == comm + compute, (serial.makespan, comm, compute)
    assert overlapped.makespan == max(comm, compute), (overlapped.makespan, comm, compute)
    assert serial.makespan - overlapped.makespan == min(comm, compute)
    assert overlapped.results[0].tolist() == [2.0] * numel


def test_async_collectives_queue_in_issue_order():
    def fn(dist, a, b):
        works = [dist.all_reduce(a, async_op=True), dist.all_reduce(b, async_op=True)]
        for w in reversed(works):  # waiting in the other order changes nothing: the queue runs in issue order
            w.wait()

    first, second = (COST.comm_ticks("all_reduce", numel * 8, 3) for numel in (10, 20))
    result = sim.run(fn, 3, args=(torch.ones(10, dtype=torch.float64), torch.ones(20, dtype=torch.float64)),
                     cost=COST)
    for r in range(3):
        spans = [(e.start, e.end) for e in result.events_of(r, "comm")]
        assert spans == [(0, first), (first, first + second)], f"rank {r}: {spans}"
    assert result.makespan == first + second


def test_a_transfer_waits_for_the_sends_issued_before_it_not_for_the_order_they_were_matched():
    """Rank 0 isends to rank 1, then to rank 2. Rank 2 posts its recv at once, rank 1 only after a long matmul:
    the simulator matches the second send first, but rank 0's sends run in the order it issued them, as on
    NCCL's stream, so the second starts when the first ends (the issue's report: a send placed by match order)."""
    m = 30

    def fn(dist, x, a):
        rank = dist.get_rank()
        if rank == 0:
            works = [dist.isend(x, 1), dist.isend(x, 2)]
            for w in works:
                w.wait()
        else:
            if rank == 1:
                a @ a
            dist.recv(x, 0)

    x = torch.ones(12, dtype=torch.float64)
    result = sim.run(fn, 3, args=(x, torch.ones(m, m, dtype=torch.float64)), cost=COST)
    send = ring_ticks("send", 12 * 8, 2)
    late = matmul_ticks(m, m, m)
    sends = sorted((e.peers, e.issued, e.start, e.end) for e in result.events_of(0, "comm"))
    assert sends == [((0, 1), 0, late, late + send), ((0, 2), 0, late + send, late + 2 * send)], sends


def test_a_rank_sends_and_receives_at_once_and_a_ring_step_costs_one_message():
    """Links are full duplex: on a ring, every rank sends to its right and receives from its left in the same
    interval, so one step of a ring collective costs alpha + n·beta, not twice that."""
    n, numel = 4, 9

    def fn(dist, out, into):
        rank, size = dist.get_rank(), dist.get_world_size()
        works = dist.batch_isend_irecv([sim.P2POp(dist.isend, out, (rank + 1) % size),
                                        sim.P2POp(dist.irecv, into, (rank - 1) % size)])
        for w in works:
            w.wait()
        return into

    result = sim.run(fn, n, args=(torch.ones(numel, dtype=torch.float64), torch.zeros(numel, dtype=torch.float64)),
                     cost=COST)
    step = ring_ticks("send", numel * 8, 2)
    assert result.makespan == step
    for r in range(n):
        assert sorted((e.kind, e.start, e.end) for e in result.events_of(r, "comm")) == \
            [("recv", 0, step), ("send", 0, step)]


def test_a_collective_waits_for_everything_issued_before_it():
    def fn(dist, x, y):
        rank = dist.get_rank()
        work = (dist.isend if rank == 0 else dist.irecv)(x, 1 - rank)
        dist.all_reduce(y)  # issued after the transfer: starts when it ends
        work.wait()

    result = sim.run(fn, 2, args=(torch.ones(5, dtype=torch.float64), torch.ones(3, dtype=torch.float64)), cost=COST)
    send, reduce = ring_ticks("send", 40, 2), ring_ticks("all_reduce", 24, 2)
    for r in range(2):
        spans = sorted((e.start, e.end, e.kind) for e in result.events_of(r, "comm"))
        assert [(s, e) for s, e, _ in spans] == [(0, send), (send, send + reduce)], spans


def test_an_op_whose_earlier_op_waits_for_it_runs_out_of_order_with_a_warning():
    """Rank 0 isends a to rank 1, then sends b to rank 2 and waits; rank 2 passes c on to rank 1 only after b
    arrives, and rank 1 receives a only after c. The send of b is queued behind the send of a, which waits for it:
    on NCCL's stream this hangs. gloo runs it, so the simulator does too, places the send of b out of issue order,
    and says so in the run's warnings."""

    def fn(dist, x):
        rank = dist.get_rank()
        if rank == 0:
            first = dist.isend(x, 1)
            dist.send(x, 2)
            first.wait()
        elif rank == 1:
            dist.recv(x, 2)
            dist.recv(x, 0)
        else:
            dist.recv(x, 0)
            dist.send(x, 1)

    result = sim.run(fn, 3, args=(torch.ones(2, dtype=torch.float64),), cost=COST)
    send = ring_ticks("send", 16, 2)
    spans = sorted((e.peers, e.start, e.end) for e in result.events_of(0, "comm"))
    assert spans == [((0, 1), 2 * send, 3 * send), ((0, 2), 0, send)], spans
    (warning,) = result.warnings
    assert "rank 0's send" in warning and "issued before it" in warning and "NCCL" in warning, warning


def test_compute_events_carry_phase_label_line_and_flops():
    m, k, n = 3, 4, 5

    def fn(dist, x, w):
        x, w = x.requires_grad_(), w.requires_grad_()
        w.register_hook(lambda g: dist.all_reduce(g))  # runs inside the backward pass
        with record_function("F0"):
            y = x @ w
        with record_function("B0"):
            y.sum().backward()
        return w.grad

    result = sim.run(fn, 2, args=(torch.ones(m, k, dtype=torch.float64), torch.ones(k, n, dtype=torch.float64)),
                     cost=COST)
    compute = result.events_of(0, "compute")
    forward = [e for e in compute if e.label == "F0"]
    assert [(e.kind, e.flops, e.op) for e in forward] == [("forward", 2 * m * k * n, "mm")], forward
    assert "y = x @ w" in forward[0].site
    loss = [e for e in compute if e.label == "B0" and e.kind == "forward"]  # y.sum() and backward's seed
    assert [(e.flops, e.op) for e in loss] == [(m * n, "sum, ones_like")], loss
    backward = [e for e in compute if e.kind == "backward"]
    assert {e.label for e in backward} == {"B0"}
    assert sum(e.product_flops for e in backward) == 2 * 2 * m * k * n  # x's gradient and w's
    (comm,) = result.events_of(0, "comm")
    assert (comm.kind, comm.phase, comm.label) == ("all_reduce", "backward", "B0"), comm
    assert result.results[0].tolist() == [[2.0 * m] * n] * k


def test_the_harness_own_ops_are_free_but_a_backward_it_starts_is_the_answers(tmp_path):
    (tmp_path / "answer_for_the_clock.py").write_text("def answer(x, w):\n    return x @ w.requires_grad_()\n")
    import importlib.util
    spec = importlib.util.spec_from_file_location("answer_for_the_clock", tmp_path / "answer_for_the_clock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def harness_program(dist, x, w):
        grads = torch.zeros_like(w)  # the harness's own op: not the answer's work
        y = module.answer(x, w)
        y.sum().backward()  # started by the harness, through the answer's graph: the answer's work
        return grads

    result = sim.run(harness_program, 1, args=(torch.ones(3, 4, dtype=torch.float64),
                                               torch.ones(4, 5, dtype=torch.float64)), cost=COST,
                     harness_files=[__file__])
    ops = [(e.kind, e.op) for e in result.events_of(0, "compute")]
    assert ops == [("forward", "mm"), ("backward", "mm")], ops


# ---- the same timeline on every run


def pipeline_and_all_reduce(dist):
    """Two stages, two microbatches, then an async all-reduce of the weight gradients across the stages."""
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    w = (0.1 * torch.randn(8, 8, dtype=torch.float64)).requires_grad_()
    for mb in range(2):
        with record_function(f"F{mb}"):
            x = torch.randn(4, 8, dtype=torch.float64) if rank == 0 else torch.empty(4, 8, dtype=torch.float64)
            if rank == 1:
                dist.recv(x, peer)
            y = torch.tanh(x @ w)
            if rank == 0:
                dist.send(y.detach(), peer)
        with record_function(f"B{mb}"):
            grad = torch.empty(4, 8, dtype=torch.float64)
            if rank == 0:
                dist.recv(grad, peer)
                y.backward(grad)
            else:
                y.sum().backward()
                dist.send(torch.ones(4, 8, dtype=torch.float64), peer)
    work = dist.all_reduce(w.grad, async_op=True)
    z = torch.randn(8, 8, dtype=torch.float64) @ w.detach()
    work.wait()
    return w.grad, z


def test_twenty_runs_give_the_same_events_ledgers_and_values():
    first = None
    for _ in range(20):
        result = sim.run(pipeline_and_all_reduce, 2, cost=COST)
        record = ([e.to_dict() for e in result.events], [ledger.timeline for ledger in result.ledgers],
                  [[t.tolist() for t in values] for values in result.results], result.makespan)
        if first is None:
            first = record
            assert len(record[0]) > 10, record[0]  # a program with something to schedule
        assert record == first


def test_infinite_bandwidth_makes_messages_cost_their_latency_only():
    cost = sim.CostModel(latency_ticks=3, bytes_per_tick=None)
    assert cost.comm_ticks("send", 1 << 20, 2) == 3
    assert cost.comm_ticks("all_reduce", 1 << 20, 4) == 2 * 3 * 3
    with pytest.raises(ValueError):
        sim.CostModel(bytes_per_tick=0)
    with pytest.raises(ValueError):
        DeviceProfile("bad", flops_per_tick=0, memory_bytes_per_tick=1, launch_ticks=0)


def test_the_puzzles_device_is_one_named_profile():
    assert CostModel().device is PUZZLE_GPU
    assert (PUZZLE_GPU.flops_per_tick, PUZZLE_GPU.memory_bytes_per_tick, PUZZLE_GPU.launch_ticks) == (1024, 2048, 4)
    assert "1,024 FLOPs/tick" in PUZZLE_GPU.describe()


def test_an_uneven_all_to_all_costs_what_its_busiest_rank_moves():
    """(N-1)·alpha + the most bytes any rank sends to or receives from the others, over the bandwidth; each rank's
    wire bytes are what it sends to the others (what leaves the rank, the figure an expert-parallel puzzle checks)."""
    cost = CostModel(latency_ticks=7, bytes_per_tick=8, device=EASY)
    n, width = 4, 3

    def rank(dist):
        me = dist.get_rank()
        sends = [me + j + 1 for j in range(n)]  # rank i sends i + j + 1 rows to rank j
        receives = [i + me + 1 for i in range(n)]
        out = torch.empty(sum(receives), width, dtype=torch.float64)
        dist.all_to_all_single(out, torch.ones(sum(sends), width, dtype=torch.float64), output_split_sizes=receives,
                               input_split_sizes=sends)

    result = sim.run(rank, world_size=n, cost=cost)
    row = width * 8
    sent = [sum(i + j + 1 for j in range(n) if j != i) * row for i in range(n)]  # receiving is symmetric here
    busiest = max(sent)
    events = result.events_of(stream="comm", kind="all_to_all_single")
    assert [e.wire_bytes for e in sorted(events, key=lambda e: e.rank)] == sent
    assert {e.ticks for e in events} == {(n - 1) * 7 + math.ceil(busiest / 8)}


def test_all_to_all_split_sizes_that_disagree_name_both_ranks():
    def rank(dist):
        receives = [1, 1] if dist.get_rank() == 0 else [2, 1]
        out = torch.empty(sum(receives), dtype=torch.float64)
        dist.all_to_all_single(out, torch.ones(2, dtype=torch.float64), output_split_sizes=receives,
                               input_split_sizes=[1, 1])

    with pytest.raises(sim.CollectiveMismatchError) as info:
        sim.run(rank, world_size=2)
    message = str(info.value)
    assert "rank 0 sends 1 rows to rank 1" in message and "rank 1 expects 2 rows from rank 0" in message, message


# ---- sim.tally: the same costs outside a run


def test_tally_charges_what_a_rank_would():
    x, w = torch.ones(8, 16, dtype=torch.float64), torch.ones(16, 32, dtype=torch.float64)
    with sim.tally(COST) as t:
        F.gelu(x @ w).sum()
    events = one_op(lambda a, b: F.gelu(a @ b).sum(), x, w)
    assert (t.flops, t.ticks, t.ops) == (sum(e.flops for e in events), sum(e.ticks for e in events), 3)
    assert t.flops_by_class["matmul"] == 2 * 8 * 16 * 32
    assert set(t.ops_by_name) == {"mm", "gelu", "sum"}
    assert "3 ops" in str(t)
