"""p10 mistake: the loss's gradient divided by the whole batch (N·b rows) instead of this rank's b, and the
reduce-scattered sum divided by N as well: the step is N times too small."""

import torch
import torch.nn.functional as F

MISTAKE = "d loss/dy divided by the whole batch instead of the rank's rows"
EXPECTED_FAILURES = {"weights after the step"}
DIAGNOSIS = "divided by the whole batch"


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
    saved = []  # what each layer's forward kept for its backward

    def gather(j):
        """Launch the all-gather of the j-th layer used, into buffer j % 2 (the other one is being computed with)."""
        return dist.all_gather_into_tensor(buffers[j % 2], shards[order[j]], async_op=True)

    # Wait for layer i's reduce-scatter (flat_grad, its input, lives until then), then update its shard.
    def finish(i, grad_shard, flat_grad, work):
        work.wait()
        shards[i] -= lr / world * grad_shard

    pending = gather(0)
    for j in range(n_layers):  # forward
        pending.wait()
        pending = gather(j + 1)  # the next layer arrives while this one computes
        x, kept = forward_keeping_activations(x, *layer_weights(buffers[j % 2]))
        saved.append(kept)
    grad = 2 * (x - target) / (x.shape[0] * dist.get_world_size())  # the whole batch's mean
    reducing = None
    for j, i in enumerate(order[n_layers:], start=n_layers):  # backward, the last layer first
        pending.wait()
        if j + 1 < 2 * n_layers:
            pending = gather(j + 1)
        grad, grad_w1, grad_w2 = backward_from_activations(saved.pop(), *layer_weights(buffers[j % 2]), grad)
        flat_grad = torch.cat([grad_w1.reshape(-1), grad_w2.reshape(-1)])
        del grad_w1, grad_w2
        if reducing is not None:
            finish(*reducing)
        grad_shard = torch.empty_like(shards[i])
        reducing = (i, grad_shard, flat_grad, dist.reduce_scatter_tensor(grad_shard, flat_grad, async_op=True))
    finish(*reducing)
