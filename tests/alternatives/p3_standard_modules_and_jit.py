"""p3, another style: an answer that uses what a learner would reach for from the list of modules a puzzle may
import (puzzles/simulator/modules.py): a `logging` logger for its progress, `math` and `functools`, a dataclass
for its settings, `typing`, `collections`, and the gradient's scaling compiled by `torch.jit.script`. Every one of
them is on the list (issue 29): none may be refused."""

import functools
import logging
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import List

import torch
import torch.nn.functional as F  # noqa: F401 (imported as learners do, to show the public API passes)

from puzzles.model import forward, loss_fn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    lr: float
    world: int


@torch.jit.script
def scaled(grad: torch.Tensor, factor: float) -> torch.Tensor:
    return grad * factor


def weights(layers) -> List[torch.Tensor]:
    named = OrderedDict((f"layers[{i}].{n}", w) for i, pair in enumerate(layers) for n, w in zip(("w1", "w2"), pair))
    return list(named.values())


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    settings = Settings(lr=lr, world=dist.get_world_size())
    loss = loss_fn(forward(x_shard, layers), target_shard)
    loss.backward()
    log.debug("rank %d: loss computed, %d weights to average", dist.get_rank(), len(weights(layers)))
    assert math.isfinite(settings.lr)
    average = functools.partial(scaled, factor=1.0 / settings.world)
    with torch.no_grad():
        for w in weights(layers):
            dist.all_reduce(w.grad)
            w.grad.copy_(average(w.grad))
            w -= settings.lr * w.grad
