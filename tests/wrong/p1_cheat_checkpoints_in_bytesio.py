"""p1 cheat (issue 29, raw memory): every block's input is kept, not as a tensor, but pickled by torch.save into an
io.BytesIO, whose bytes no ledger saw: peak memory of k checkpoints with every activation at hand. torch.save
from a rank without a checkpoint disk is refused now (puzzles/simulator/escapes.py): its pickler takes a storage's
bytes by persistent_id, past every __reduce__ a guard could watch.
Before any of that, since issue 29's list of modules, the file is refused where it imports io (p18's alone)
(puzzles/simulator/modules.py): it is not graded. The rule above still holds by itself ("without a checkpoint disk",
tests/test_sim_threads.py, test_allowed_leaving_torch.py, test_sim_filesystem.py)."""

import io

import torch

from puzzles.model import block

MISTAKE = "every activation kept as torch.save bytes in a BytesIO, off the ledger"
EXPECTED_STATUS = "error"
DIAGNOSIS = "imports io"


def checkpointed_forward(x, layers, k):
    saved = []
    with torch.no_grad():
        for w1, w2 in layers:
            buf = io.BytesIO()
            torch.save(x, buf)
            saved.append(buf)
            x = block(x, w1, w2)
    return saved, x


def checkpointed_backward(saved, layers, k, grad_y):
    grad = grad_y
    for i in reversed(range(len(layers))):
        saved[i].seek(0)
        x = torch.load(saved[i]).requires_grad_()
        w1, w2 = layers[i]
        with torch.enable_grad():
            y = block(x, w1, w2)
        grad, = torch.autograd.grad(y, x, grad)
    return grad
