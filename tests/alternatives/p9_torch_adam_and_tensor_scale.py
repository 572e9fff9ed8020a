"""p9 in torch.amp's style: torch.optim.Adam on the float32 master weights (its state, 'step' included, lives in
the optimizer), the scale and the growth tracker kept as float32/int32 tensors as GradScaler keeps them, the
gradients unscaled by multiplying with the inverse scale, and optimizer.step() simply not called on an overflow.
The master gradients exist only inside step()."""

import torch


class MixedPrecisionAdam:
    def __init__(self, layers, lr, betas, eps, init_scale, growth_interval):
        self.masters = [w for pair in layers for w in pair]
        self.adam = torch.optim.Adam(self.masters, lr=lr, betas=betas, eps=eps, foreach=False)
        self.half_layers = [tuple(w.detach().half().requires_grad_() for w in pair) for pair in layers]
        self._scale = torch.full((), init_scale, dtype=torch.float32)
        self._growth_tracker = torch.zeros((), dtype=torch.int32)
        self.growth_interval = growth_interval

    def scale(self, loss):
        return loss * self._scale

    def step(self):
        halves = [w for pair in self.half_layers for w in pair]
        inv_scale = self._scale.double().reciprocal().float()
        with torch.no_grad():
            for master, half in zip(self.masters, halves):
                master.grad = half.grad.float() * inv_scale
            found_inf = any(not torch.isfinite(m.grad).all() for m in self.masters)
            if not found_inf:
                self.adam.step()
            self.adam.zero_grad(set_to_none=True)
            if found_inf:
                self._scale *= 0.5
                self._growth_tracker.zero_()
                return
            for master, half in zip(self.masters, halves):
                half.copy_(master)
            self._growth_tracker += 1
            if int(self._growth_tracker) == self.growth_interval:
                self._scale *= 2.0
                self._growth_tracker.zero_()

    def get_scale(self):
        return self._scale.item()
