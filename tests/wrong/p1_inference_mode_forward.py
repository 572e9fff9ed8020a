"""p1 mistake: the checkpointed forward runs under torch.inference_mode() instead of torch.no_grad(): its
checkpoints are inference tensors, which the recomputation cannot make require grad (torch raises)."""

import torch

from puzzles.model import block, forward

MISTAKE = "the forward run under torch.inference_mode(), whose checkpoints can never join a graph again"
EXPECTED_STATUS = "error"
DIAGNOSIS = "torch.inference_mode()"


def checkpointed_forward(x, layers, k):
    saved = []
    with torch.inference_mode():
        for i, (w1, w2) in enumerate(layers):
            if i % k == 0:
                saved.append(x)  # the input of blocks 0, k, 2k, ...: the first one is x itself, free
            x = block(x, w1, w2)
    return saved, x


def checkpointed_backward(saved, layers, k, grad_y):
    grad = grad_y
    for s in reversed(range(len(saved))):
        start = saved[s].detach().requires_grad_()
        with torch.enable_grad(), torch.profiler.record_function("recompute"):  # the label shows on the chart
            out = forward(start, layers[s * k:(s + 1) * k])
        out.backward(grad)  # fills the segment's weights' .grad and start.grad, and frees the segment's graph
        grad = start.grad
        del start, out
    return grad
