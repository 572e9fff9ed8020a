"""p10 cheat against the memory rules: each gathered layer is cloned and the clone kept for the backward (the
gather buffers themselves are let go), the backward still launches its gathers, so that the bytes sent are
ZeRO-3's, and a tiny reduce-scatter comes first, to end the forward-memory window before it begins. The gathered
buffers alive look right; the ledger sees the clones, and the window closes only at a layer's gradient. The clones
also run while the next layer's gather is in flight: copies with no arithmetic, which hide no communication, so
the makespan is over too (issue 29)."""

import torch
import torch.nn.functional as F

MISTAKE = ("copies of every layer's weights are kept from the forward for the backward, the backward's gathers "
           "only for show")
EXPECTED_FAILURES = {"forward memory", "makespan"}
DIAGNOSIS = "copies of the gathered weights"


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

    # A tiny reduce-scatter first, in the hope that the grader takes the backward to have begun (it does not:
    # only a collective of at least a layer's gradient bytes ends the forward).
    dist.reduce_scatter_tensor(torch.empty(1, dtype=torch.float64), torch.zeros(world, dtype=torch.float64))
    pending = gather(0)
    saved, copies = [], []
    for j in range(n_layers):  # forward
        pending.wait()
        pending = gather(j + 1)  # the next layer arrives while this one computes
        copies.append(buffers[j % 2].clone())
        x, kept = forward_keeping_activations(x, *layer_weights(copies[-1]))
        saved.append(kept)
    grad = 2 * (x - target) / x.shape[0]  # d loss / d y for this rank's rows
    reducing = None
    for j in range(n_layers, 2 * n_layers):  # backward, the last layer first
        i = order[j]
        pending.wait()
        if j + 1 < 2 * n_layers:
            pending = gather(j + 1)
        grad, grad_w1, grad_w2 = backward_from_activations(saved.pop(), *layer_weights(copies.pop()), grad)
        flat_grad = torch.cat([grad_w1.reshape(-1), grad_w2.reshape(-1)])
        del grad_w1, grad_w2
        if reducing is not None:
            finish(*reducing)
        grad_shard = torch.empty_like(shards[i])
        reducing = (i, grad_shard, flat_grad, dist.reduce_scatter_tensor(grad_shard, flat_grad, async_op=True))
    finish(*reducing)
