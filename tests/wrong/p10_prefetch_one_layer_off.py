"""p10 mistake: the prefetch is one layer off: while layer j computes, the buffer for the next slot receives
layer order[j] (the layer computing) instead of order[j + 1], so one layer is gathered twice and the next never:
every later layer computes with the weights of the layer before it."""

import torch
import torch.nn.functional as F

MISTAKE = "the prefetch is one layer off: it gathers the layer just used instead of the next one"
EXPECTED_FAILURES = {"weights after the step"}
DIAGNOSIS = "the prefetch is one layer off"


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

    def gather(j, layer):
        """Launch the all-gather of `layer` into buffer j % 2 (the other one is being computed with)."""
        return dist.all_gather_into_tensor(buffers[j % 2], shards[layer], async_op=True)

    # Wait for layer i's reduce-scatter (flat_grad, its input, lives until then), then update its shard.
    def finish(i, grad_shard, flat_grad, work):
        work.wait()
        shards[i] -= lr / world * grad_shard

    pending = gather(0, order[0])
    for j in range(n_layers):  # forward
        pending.wait()
        pending = gather(j + 1, order[j])  # one off: the layer just used, not the next one
        x, kept = forward_keeping_activations(x, *layer_weights(buffers[j % 2]))
        saved.append(kept)
    grad = 2 * (x - target) / x.shape[0]  # d loss / d y for this rank's rows
    reducing = None
    for j, i in enumerate(order[n_layers:], start=n_layers):  # backward, the last layer first
        pending.wait()
        if j + 1 < 2 * n_layers:
            pending = gather(j + 1, order[j])
        grad, grad_w1, grad_w2 = backward_from_activations(saved.pop(), *layer_weights(buffers[j % 2]), grad)
        flat_grad = torch.cat([grad_w1.reshape(-1), grad_w2.reshape(-1)])
        del grad_w1, grad_w2
        if reducing is not None:
            finish(*reducing)
        grad_shard = torch.empty_like(shards[i])
        reducing = (i, grad_shard, flat_grad, dist.reduce_scatter_tensor(grad_shard, flat_grad, async_op=True))
    finish(*reducing)
