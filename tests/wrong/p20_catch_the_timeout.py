"""A cheat: p20's program as handed out, every collective wrapped in try/except so that a rank that times out
carries on. On a real job a caught NCCL timeout leaves the communicator aborted (every later call fails, or the
process is torn down by the watchdog); here the hang stops the run however the code catches, so the run fails."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "Catches the timeout (or any error) around each collective instead of fixing why the ranks part."
EXPECTED_STATUS = "error"
DIAGNOSIS = "flight recorder analysis"

MICRO = 4


def _reduce(dist, t):
    try:
        dist.all_reduce(t)
    except Exception:  # noqa: BLE001 (the cheat: carry on past a timeout)
        pass


def train_step(dist, x, target, valid, layers, lr):
    world = dist.get_world_size()
    rows, targets = x[valid], target[valid]
    if rows.shape[0] == 0:
        return None
    weights = [w for pair in layers for w in pair]
    total = torch.zeros((), dtype=torch.float64)
    for start in range(0, rows.shape[0], MICRO):
        xm, tm = rows[start:start + MICRO], targets[start:start + MICRO]
        loss = loss_fn(forward(xm, layers), tm) * xm.shape[0] / rows.shape[0]
        grads = torch.autograd.grad(loss, weights)
        for w, g in zip(weights, grads):
            _reduce(dist, g)
            g /= world
            w.grad = g if w.grad is None else w.grad + g
        total += loss.detach()
    _reduce(dist, total)
    with torch.no_grad():
        for w in weights:
            w -= lr * w.grad
    return total / world
