"""Naive p10: ZeRO-2's habit. Each layer is all-gathered once, before its forward (prefetched, asynchronously),
and kept for the backward, so the backward gathers nothing. Right values, no time lost, but every rank ends the
forward holding the whole model (8Ψ), and sends data parallel's volume, not ZeRO-3's."""

import torch
import torch.nn.functional as F

EXPECTED_FAILURES = {"gathered weights", "forward memory", "communication"}
DIAGNOSIS = "each layer's weights were kept after its forward"


def layer_weights(flat):
    d, h = 64, 256
    return flat[:d * h].view(d, h), flat[d * h:].view(h, d)


def forward_keeping_activations(x, w1, w2):
    a = x @ w1
    return x + F.gelu(a) @ w2, (x, a)


def backward_from_activations(saved, w1, w2, grad_y):
    x, a = saved
    cdf = 0.5 * (1 + torch.erf(a * 0.5 ** 0.5))
    pdf = torch.exp(-0.5 * a * a) * (2 * torch.pi) ** -0.5
    grad_w2 = (a * cdf).T @ grad_y
    grad_a = (grad_y @ w2.T) * (cdf + a * pdf)
    grad_w1 = x.T @ grad_a
    grad_x = grad_y + grad_a @ w1.T
    return grad_x, grad_w1, grad_w2


def fsdp_step(dist, shards, x, target, lr):
    world, n_layers = dist.get_world_size(), len(shards)

    def gather(i):
        full = torch.empty(world * shards[i].numel(), dtype=shards[i].dtype)
        return full, dist.all_gather_into_tensor(full, shards[i], async_op=True)

    weights, saved = [], []
    pending = gather(0)
    for i in range(n_layers):
        full, work = pending
        work.wait()
        if i + 1 < n_layers:
            pending = gather(i + 1)
        weights.append(full)  # kept for the backward
        x, kept = forward_keeping_activations(x, *layer_weights(full))
        saved.append(kept)
    grad = 2 * (x - target) / x.shape[0]
    reducing = []
    for i in reversed(range(n_layers)):
        grad, g1, g2 = backward_from_activations(saved.pop(), *layer_weights(weights.pop()), grad)
        flat = torch.cat([g1.reshape(-1), g2.reshape(-1)])
        out = torch.empty_like(shards[i])
        reducing.append((i, out, flat, dist.reduce_scatter_tensor(out, flat, async_op=True)))
    for i, out, flat, work in reducing:
        work.wait()
        shards[i] -= lr / world * out
