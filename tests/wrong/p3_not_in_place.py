"""p3 mistake: rebinding names instead of updating the weights in place, so the weights never change."""

from puzzles.model import forward, loss_fn

MISTAKE = "names are rebound instead of updating the weights in place"
EXPECTED_FAILURES = {"averaged gradients", "updated weights"}
DIAGNOSIS = "the weights did not change"


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    for w1, w2 in layers:
        for w in (w1, w2):
            dist.all_reduce(w.grad)
            w = w.detach() - lr * w.grad / dist.get_world_size()  # a new tensor; the rank's weight is untouched
