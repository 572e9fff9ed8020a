"""p7 mistake: dividing the gradient by the world size right after launching its all-reduce, while the all-reduce
is still in flight (on a GPU: a race that silently corrupts the gradient). The simulator stops it and says so."""

from puzzles.model import forward, loss_fn

MISTAKE = "the gradient is divided while its async all-reduce is in flight"
EXPECTED_STATUS = "error"
DIAGNOSIS = "while its async all_reduce"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    pending = []

    def launch(w):
        pending.append(dist.all_reduce(w.grad, async_op=True))
        w.grad /= dist.get_world_size()  # too early: the all-reduce is still reading and writing w.grad

    hooks = [w.register_post_accumulate_grad_hook(launch) for pair in layers for w in pair]
    loss_fn(forward(x_shard, layers), target_shard).backward()
    for work in pending:
        work.wait()
    for h in hooks:
        h.remove()
