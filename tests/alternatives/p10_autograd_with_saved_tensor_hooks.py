"""p10 the way FSDP does it inside autograd: the model's own `block` (puzzles.model) and loss.backward(), no
hand-written backward. A custom autograd Function gathers a layer in its forward and reduce-scatters the layer's
gradient (asynchronously) in its backward; `torch.autograd.graph.saved_tensors_hooks` keeps the graph from
saving the gathered weights: a weight autograd wants to save is packed as a note of where it lives, and unpacked
in the backward by gathering that layer again (prefetched one layer ahead). A zero-sized leaf that requires grad
makes autograd call the Function's backward."""

import torch

from puzzles.model import block, loss_fn


def fsdp_step(dist, shards, x, target, lr):
    world, n = dist.get_world_size(), len(shards)
    order = [*range(n), *reversed(range(n))]
    slots = {}  # position in `order` -> (buffer, work): the gathers launched and not yet let go
    reducing = []

    def launch(position):
        if position < len(order) and position not in slots:
            buffer = torch.empty(world * shards[0].numel(), dtype=torch.float64)
            slots[position] = (buffer, dist.all_gather_into_tensor(buffer, shards[order[position]], async_op=True))

    def take(position):
        """The gathered layer used at `position`, waited for; older gathers let go; the next one launched."""
        for old in [p for p in slots if p < position]:
            del slots[old]
        buffer, work = slots[position]
        work.wait()
        launch(position + 1)
        return buffer

    def finish():
        layer, grad_shard, _flat, work = reducing.pop()
        work.wait()
        shards[layer].sub_(grad_shard, alpha=lr / world)

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, anchor, position):
            ctx.layer = order[position]
            return take(position)

        @staticmethod
        def backward(ctx, grad_full):
            if reducing:
                finish()
            grad_shard = torch.empty_like(shards[ctx.layer])
            flat = grad_full.contiguous()
            reducing.append((ctx.layer, grad_shard, flat,
                             dist.reduce_scatter_tensor(grad_shard, flat, async_op=True)))
            return None, None

    current = {}  # the storage of the layer computing now, and where that layer is used again

    def pack(t):
        if current and t.untyped_storage().data_ptr() == current["ptr"]:
            return (current["again"], t.storage_offset(), t.shape, t.stride())
        return t

    def unpack(saved):
        if isinstance(saved, torch.Tensor):
            return saved
        position, offset, shape, stride = saved
        return take(position).as_strided(shape, stride, offset)

    anchor = torch.empty(0, dtype=torch.float64, requires_grad=True)
    launch(0)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        for position in range(n):
            full = Gather.apply(anchor, position)
            current.update(ptr=full.untyped_storage().data_ptr(), again=len(order) - 1 - position)
            d, h = x.shape[1], full.numel() // (2 * x.shape[1])
            x = block(x, full[:d * h].view(d, h), full[d * h:].view(h, d))
            del full
        current.clear()
    loss_fn(x, target).backward()
    while reducing:
        finish()
