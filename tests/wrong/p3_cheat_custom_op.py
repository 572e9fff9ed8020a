"""p3 cheat (issue 29, ops): the block's products wrapped in a torch.library.custom_op, whose body runs with the
dispatch modes popped: its matmuls cost nothing and allocated nothing, as far as the grader could tell. An op
runs on a rank now only if puzzles/simulator/op_costs.py has a cost formula for it: the custom op is refused."""

import torch
import torch.nn.functional as F

from puzzles.model import loss_fn

MISTAKE = "the products hidden inside a custom op, whose body runs off the clock"
EXPECTED_STATUS = "error"
DIAGNOSIS = "has no cost formula"


@torch.library.custom_op("p3_cheat::matmul", mutates_args=())
def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    x = x_shard
    for w1, w2 in layers:
        x = x + matmul(F.gelu(matmul(x, w1.detach())), w2.detach())
    loss_fn(x, target_shard)
    for w1, w2 in layers:
        for w in (w1, w2):
            w.grad = torch.zeros_like(w)
