"""The per-rank memory ledger: what it counts, what it does not, and where it says the bytes came from."""


import torch
import torch.nn.functional as F
from sim_helpers import site_in
from torch.testing import assert_close

from puzzles import sim

F64 = 8  # bytes per float64
B, D, H = 64, 16, 32  # batch, model width, hidden width of the MLP


def site(marker: str) -> str:
    return site_in(__file__, marker)


def increments(ledger) -> list[int]:
    """The size of every step of the ledger's timeline (+ allocations, - frees)."""
    return [b - a for (_, a), (_, b) in zip(ledger.timeline, ledger.timeline[1:])]


# ---- an L-layer MLP, trained plainly and with manual checkpointing


def layer(x, w1, w2):
    return x + F.gelu(x @ w1) @ w2


def make_weights(n_layers):
    return [((0.1 * torch.randn(D, H, dtype=torch.float64)).requires_grad_(),
             (0.1 * torch.randn(H, D, dtype=torch.float64)).requires_grad_()) for _ in range(n_layers)]


def plain(dist, x, n_layers):
    weights = make_weights(n_layers)
    h = x
    for w1, w2 in weights:
        h = layer(h, w1, w2)
    h.sum().backward()
    return [w.grad for pair in weights for w in pair]


def checkpointed(dist, x, n_layers):
    """Keep only each layer's input in the forward pass; recompute the layer's activations in the backward pass."""
    weights = make_weights(n_layers)
    with torch.no_grad():
        inputs = [x]
        for w1, w2 in weights:
            inputs.append(layer(inputs[-1], w1, w2))
    grad = torch.ones_like(inputs.pop())
    for w1, w2 in reversed(weights):
        xi = inputs.pop().detach().requires_grad_(True)
        layer(xi, w1, w2).backward(grad)
        grad = xi.grad
    return [w.grad for pair in weights for w in pair]


def mlp_peaks(step):
    x = torch.randn(B, D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    runs = {n_layers: sim.run(step, 1, args=(x, n_layers)) for n_layers in (2, 4, 8)}
    return {n_layers: run.peak_bytes[0] for n_layers, run in runs.items()}, runs[8].results[0]


def test_mlp_peak_grows_linearly_in_depth_and_checkpointing_lowers_it():
    plain_peaks, plain_grads = mlp_peaks(plain)
    ckpt_peaks, ckpt_grads = mlp_peaks(checkpointed)
    for name, peaks in (("plain", plain_peaks), ("checkpointed", ckpt_peaks)):
        assert peaks[8] - peaks[4] == 2 * (peaks[4] - peaks[2]), f"{name} peaks are not affine in L: {peaks}"
    weights = 2 * D * H * F64
    # Per layer, the plain pass keeps its output, and for backward x @ w1 and gelu(x @ w1); the checkpointed one
    # keeps only the output (the next layer's input). Both keep the layer's weights.
    assert plain_peaks[4] - plain_peaks[2] == 2 * (B * D * F64 + 2 * B * H * F64 + weights), plain_peaks
    assert ckpt_peaks[4] - ckpt_peaks[2] == 2 * (B * D * F64 + weights), ckpt_peaks
    assert ckpt_peaks[8] < plain_peaks[8], (ckpt_peaks, plain_peaks)
    for got, want in zip(ckpt_grads, plain_grads):  # and the recomputation gives the same gradients
        assert_close(got, want)


# ---- what costs bytes and what does not


def test_views_and_in_place_ops_add_no_bytes():
    def fn(dist):
        x = torch.zeros(100, 10, dtype=torch.float64)
        views = [x[:5], x[:, 3], x.t(), x.detach(), x.view(-1), x.reshape(1000), x.unsqueeze(0), x.T[2:4]]
        x.add_(1)
        x.mul_(3)
        x[3:7].zero_()
        x.t().clamp_(max=2)
        views[3].sub_(1)
        return views

    ledger = sim.run(fn, 1).ledgers[0]
    assert increments(ledger) == [100 * 10 * F64], f"timeline: {ledger.timeline}"
    assert (ledger.peak, ledger.current) == (8000, 8000), ledger


def test_a_freed_tensor_is_released():
    def fn(dist, keep_first):
        a = torch.zeros(1000, dtype=torch.float64)
        b = torch.zeros(1000, dtype=torch.float64)
        if not keep_first:
            del a
        c = torch.zeros(1000, dtype=torch.float64)
        return b, c

    kept, freed = (sim.run(fn, 1, args=(keep,)).ledgers[0] for keep in (True, False))
    assert (kept.peak, kept.current) == (24000, 16000), kept  # a dies at return, before the ledger closes
    assert (freed.peak, freed.current) == (16000, 16000), freed
    assert increments(freed) == [8000, 8000, -8000, 8000], freed.timeline


def test_received_tensor_counts_on_the_receiver():
    def fn(dist):
        if dist.get_rank() == 0:
            dist.send(torch.ones(1000, dtype=torch.float64), 1)
            return None
        buf = torch.empty(1000, dtype=torch.float64)  # receive-buffer
        dist.recv(buf, 0)
        return buf * 2  # the received data is the receiver's own

    result = sim.run(fn, 2)
    receiver = result.ledgers[1]
    assert receiver.peak == 2 * 8000, receiver  # the buffer and buf * 2, nothing of the sender's
    assert receiver.current == 8000, receiver
    assert receiver.peak_by_line()[0][:2] == (site("receive-buffer"), 8000), receiver.peak_by_line()
    assert (result.ledgers[0].peak, result.ledgers[0].current) == (8000, 0), result.ledgers[0]
    assert_close(result.results[1], torch.full((1000,), 2.0, dtype=torch.float64))


def test_buffers_of_finished_communication_are_released():
    def fn(dist):
        for _ in range(3):
            x = torch.ones(1000, dtype=torch.float64)
            if dist.get_rank() == 0:
                dist.send(x, 1)
            else:
                dist.recv(x, 0)
            dist.all_reduce(x)
            dist.all_reduce(x, async_op=True).wait()
            del x

    for ledger in sim.run(fn, 2).ledgers:
        assert (ledger.peak, ledger.current) == (8000, 0), f"{ledger}: {ledger.timeline}"


def test_arguments_placed_by_the_harness_count_on_their_rank():
    shared = torch.zeros(100, dtype=torch.float64)

    def fn(dist, a, again, mine):
        a.add_(1)  # each rank has its own copy
        return a, a is again

    result = sim.run(fn, 3, args=(shared, shared), rank_args=[(torch.zeros(r + 1, 10, dtype=torch.float64),)
                                                              for r in range(3)])
    for r, ledger in enumerate(result.ledgers):
        assert ledger.peak == 800 + (r + 1) * 80, f"rank {r}: {ledger}"
        assert ledger.peak_by_line()[0][0] == "input placed on the rank by sim.run", ledger.peak_by_line()
    for r, (a, same) in enumerate(result.results):
        assert same, f"rank {r} got two copies of one tensor passed twice"
        assert_close(a, torch.ones(100, dtype=torch.float64), rtol=0, atol=0)
    assert shared.sum().item() == 0.0, "a rank changed the caller's tensor"


def test_peak_by_line_names_the_allocating_line():
    def fn(dist):
        small = torch.zeros(10, dtype=torch.float64)
        big = torch.zeros(50_000, dtype=torch.float64)  # big-allocation
        total = big.sum() + small.sum()
        del big
        return total

    by_line = sim.run(fn, 1).ledgers[0].peak_by_line()
    assert by_line[0] == (site("big-allocation"), 400_000, 1), by_line
