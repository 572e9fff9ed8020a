"""p1 cheat (issue 29, found by a blind attack): no checkpointing, and the world found by walking frames from the
one logging.currentframe() hands out (logging's own code took it, which the frame rule let through), the ledger's
bookkeeping then replaced by no-ops. The frame rule now looks through logging.currentframe to the rank's line that
called it."""
import logging

from puzzles.model import forward


MISTAKE = "the ledger's bookkeeping disabled through a frame logging.currentframe() hands out"
EXPECTED_STATUS = "error"
DIAGNOSIS = "logging.currentframe()"


def _nothing(*args, **kwargs):
    return None


def _world():
    f = logging.currentframe()
    while f is not None:
        obj = f.f_locals.get("self")
        if type(obj).__name__ == "World":
            return obj
        f = f.f_back
    raise RuntimeError("no World on the stack")


def checkpointed_forward(x, layers, k):
    world = _world()
    ledger = world.ledgers[world.current_rank()]
    ledger.allocate = ledger.free = ledger.resize = _nothing
    setattr(ledger, "_alive" + "_keys", lambda: [])
    x0 = x.detach().requires_grad_()
    y = forward(x0, layers)
    return (x0, y), y.detach()


def checkpointed_backward(saved, layers, k, grad_y):
    x0, y = saved
    y.backward(grad_y)
    return x0.grad
