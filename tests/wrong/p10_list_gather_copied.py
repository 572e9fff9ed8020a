"""p10 mistake (slow, not wrong in values or memory): each layer gathered with dist.all_gather into N shard-sized
tensors and concatenated, so every gather is followed by a copy of the whole layer (torch.cat), 8 copies of
256 KiB in the step. On the roofline clock a copy costs its memory traffic: the compute stream works 1.49·C
where the step needs C, and compute beyond 1.25·C hides no communication. (Under the matmul-only clock of
issue 15 this answer passed, as an alternative; torch's FSDP2 dropped exactly this copy of FSDP1's flat
parameters.) all_gather_into_tensor into one flat buffer, and views of it, need no copy."""

import torch
import torch.nn.functional as F

MISTAKE = "each layer is all-gathered into a list and copied into one tensor with torch.cat, 8 copies of a layer per step"
EXPECTED_FAILURES = {"makespan"}
DIAGNOSIS = "copied memory and computed nothing"


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



def gather_layer(dist, shard):
    parts = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    return parts, dist.all_gather(parts, shard, async_op=True)


def fsdp_step(dist, shards, x, target, lr):
    n, world = len(shards), dist.get_world_size()
    order = list(range(n)) + list(reversed(range(n)))
    nxt = gather_layer(dist, shards[order[0]])
    keep = []
    for step in range(n):
        parts, work = nxt
        work.wait()
        nxt = gather_layer(dist, shards[order[step + 1]])
        full = torch.cat(parts)
        del parts
        x, kept = forward_keeping_activations(x, *layer_weights(full))
        keep.append(kept)
        del full
    grad = (x - target) * (2.0 / x.shape[0])
    pending = []
    for step in range(n, 2 * n):
        layer = order[step]
        parts, work = nxt
        work.wait()
        if step + 1 < 2 * n:
            nxt = gather_layer(dist, shards[order[step + 1]])
        full = torch.cat(parts)
        del parts
        grad, g1, g2 = backward_from_activations(keep.pop(), *layer_weights(full), grad)
        del full
        flat = torch.cat([g1.reshape(-1), g2.reshape(-1)])
        del g1, g2
        out = torch.empty_like(shards[layer])
        pending.append((layer, out, flat, dist.reduce_scatter_tensor(out, flat, async_op=True)))
        if len(pending) >= 2:
            pending[-2][3].wait()
    for layer, out, flat, work in pending:
        work.wait()
        shards[layer].copy_(shards[layer] - lr * out / world)
