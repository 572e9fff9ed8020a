"""p10 with a fresh buffer for every gather, a queue of in-flight gathers, and named phases: each buffer is let go
(rebound) as soon as its layer has computed; the reduce-scatter of layer i is waited for after layer i-1's
backward, its shard updated there. The loss gradient comes from autograd on a detached y."""

import torch
import torch.nn.functional as F


def layer_weights(flat):
    """A flat layer (2·d·h numbers: w1 then w2, row-major) as views (w1 [64, 256], w2 [256, 64])."""
    d, h = 64, 256
    return flat[:d * h].view(d, h), flat[d * h:].view(h, d)


def forward_keeping_activations(x, w1, w2):
    """One block, x + gelu(x @ w1) @ w2, and what its backward needs: (x, x @ w1). Not the weights."""
    a = x @ w1
    return x + F.gelu(a) @ w2, (x, a)


def backward_from_activations(saved, w1, w2, grad_y):
    """The block's backward from what the forward kept and the weights: (grad_x, grad_w1, grad_w2)."""
    x, a = saved
    cdf = 0.5 * (1 + torch.erf(a * 0.5 ** 0.5))  # gelu(a) = a·cdf(a); gelu'(a) = cdf(a) + a·pdf(a)
    pdf = torch.exp(-0.5 * a * a) * (2 * torch.pi) ** -0.5
    grad_w2 = (a * cdf).T @ grad_y
    grad_a = (grad_y @ w2.T) * (cdf + a * pdf)
    grad_w1 = x.T @ grad_a
    grad_x = grad_y + grad_a @ w1.T
    return grad_x, grad_w1, grad_w2


from puzzles.model import loss_fn


def fsdp_step(dist, shards, x, target, lr):
    world = dist.get_world_size()
    sequence = list(range(len(shards))) + list(range(len(shards)))[::-1]

    def launch(position):
        layer = sequence[position]
        buffer = torch.empty(world * shards[layer].numel(), dtype=torch.float64)
        return buffer, dist.all_gather_into_tensor(buffer, shards[layer], async_op=True)

    in_flight = launch(0)
    activations = []
    for position in range(len(shards)):
        full, work = in_flight
        work.wait()
        in_flight = launch(position + 1)
        x, kept = forward_keeping_activations(x, *layer_weights(full))
        activations.append(kept)
        del full, work

    y = x.detach().requires_grad_()
    loss_fn(y, target).backward()
    grad = y.grad
    del y

    previous = None
    for position in range(len(shards), len(sequence)):
        layer = sequence[position]
        full, work = in_flight
        work.wait()
        in_flight = launch(position + 1) if position + 1 < len(sequence) else None
        grad, g1, g2 = backward_from_activations(activations.pop(), *layer_weights(full), grad)
        del full, work
        if previous is not None:
            prev_layer, prev_shard, _, prev_work = previous
            prev_work.wait()
            shards[prev_layer].sub_(prev_shard, alpha=lr / world)
        flat = torch.cat((g1.flatten(), g2.flatten()))
        del g1, g2
        shard_grad = torch.zeros_like(shards[layer])
        previous = (layer, shard_grad, flat, dist.reduce_scatter_tensor(shard_grad, flat, async_op=True))
    prev_layer, prev_shard, _, prev_work = previous
    prev_work.wait()
    shards[prev_layer].sub_(prev_shard, alpha=lr / world)
