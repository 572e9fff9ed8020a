"""p7 cheat (issue 29): each gradient's all-reduce is launched from its hook and waited for right there, so backward
stops for every message, as in a synchronous step; while the message is in flight the hook clones a buffer it
never uses, 18 clones in all. The clones kept the compute stream busy, and the old measure (makespan less the
busiest rank's compute, counted up to 1.25·C) counted them as the compute the messages hid behind: 1,080 exposed
ticks, within the budget, for a step 2,948 ticks slower than the reference's. Ticks that ran under a message with
no arithmetic to explain them hide nothing now: all 3,456 ticks of communication are exposed."""

import torch

from puzzles.model import forward, loss_fn

MISTAKE = "every all-reduce waited for in its hook, the wait padded with clones that do no work"
EXPECTED_FAILURES = {"makespan"}
DIAGNOSIS = "They keep the stream busy but hide nothing"


def overlapped_step(dist, x_shard, target_shard, layers, lr):
    pad = torch.zeros(64, 256, dtype=torch.float64)
    launched = [0]

    def reduce_now(w):
        work = dist.all_reduce(w.grad, async_op=True)
        for _ in range(3 if launched[0] < 2 else 2):  # 18 clones, while the message is in flight
            pad.clone()
        launched[0] += 1
        work.wait()

    hooks = [w.register_post_accumulate_grad_hook(reduce_now) for pair in layers for w in pair]
    loss_fn(forward(x_shard, layers), target_shard).backward()
    for h in hooks:
        h.remove()
    world = dist.get_world_size()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                w -= lr / world * w.grad
