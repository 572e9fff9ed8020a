"""p23 cheat (issue 29, found by a blind attack): the program as handed out (an even split), with the straggler
taken out of the run's cost model through the rank's own thread object (logging.threading.current_thread()._target
was the world's bound method), the model put back by the last rank. A rank's thread now drops its target and its
arguments before the rank's code runs: the attribute is gone."""
import dataclasses
import logging

import torch

from puzzles.model import forward, loss_fn


MISTAKE = "the straggler taken out of the cost model through the rank's thread object"
EXPECTED_STATUS = "error"
DIAGNOSIS = "has no attribute '_target'"


def train_balanced(dist, batches, layers, lr):
    w0 = logging.threading.current_thread()._target.__self__
    if not hasattr(w0, "first_cost"):
        w0.first_cost, w0.finished = w0.cost, 0
        w0.cost = dataclasses.replace(w0.cost, slow_ranks=())
    world, rank = dist.get_world_size(), dist.get_rank()
    weights = [w for pair in layers for w in pair]
    per = len(batches[0]) // world  # an even split: 22 rows each
    for batch in batches:
        x, target = batch[rank * per:(rank + 1) * per]
        loss = loss_fn(forward(x, layers), target)
        loss.backward()
        for w in weights:
            dist.all_reduce(w.grad)
        with torch.no_grad():
            for w in weights:
                w -= lr / world * w.grad
                w.grad = None
    w0.finished += 1
    if w0.finished == world:
        w0.cost = w0.first_cost
