"""p10 mistake: the forward keeps only each block's input (as activation checkpointing would) and the backward
recomputes x @ w1: one more matmul per block than the step needs."""

import torch
import torch.nn.functional as F

MISTAKE = "x @ w1 is recomputed in the backward"
EXPECTED_FAILURES = {"compute"}  # it recomputes, but its communication still hides
DIAGNOSIS = "x @ w1 again for every block"


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


def fsdp_step(dist, shards, x, target, lr):
    world, n_layers = dist.get_world_size(), len(shards)
    order = [*range(n_layers), *reversed(range(n_layers))]  # the layers in the order they are used
    buffers = [torch.empty(world * shards[0].numel(), dtype=shards[0].dtype) for _ in range(2)]

    def gather(j):
        """Launch the all-gather of the j-th layer used, into buffer j % 2 (the other one is being computed with)."""
        return dist.all_gather_into_tensor(buffers[j % 2], shards[order[j]], async_op=True)

    def finish(i, grad_shard, flat_grad, work):
        """Wait for layer i's reduce-scatter, then update its shard with the averaged gradient."""
        work.wait()
        shards[i] -= lr / world * grad_shard

    pending = gather(0)
    saved = []
    for j in range(n_layers):  # forward
        pending.wait()
        pending = gather(j + 1)  # the next layer arrives while this one computes
        x, kept = forward_keeping_activations(x, *layer_weights(buffers[j % 2]))
        saved.append(kept[0])
    grad = 2 * (x - target) / x.shape[0]  # d loss / d y for this rank's rows
    reducing = None
    for j in range(n_layers, 2 * n_layers):  # backward, the last layer first
        i = order[j]
        pending.wait()
        if j + 1 < 2 * n_layers:
            pending = gather(j + 1)
        w1, w2 = layer_weights(buffers[j % 2])
        block_input = saved.pop()
        grad, grad_w1, grad_w2 = backward_from_activations((block_input, block_input @ w1), w1, w2, grad)
        del w1, w2
        flat_grad = torch.cat([grad_w1.reshape(-1), grad_w2.reshape(-1)])
        del grad_w1, grad_w2
        if reducing is not None:
            finish(*reducing)
        grad_shard = torch.empty_like(shards[i])
        reducing = (i, grad_shard, flat_grad, dist.reduce_scatter_tensor(grad_shard, flat_grad, async_op=True))
    finish(*reducing)
