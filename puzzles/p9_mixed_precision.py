# Generated from solutions/p9_mixed_precision.py by `python -m grader build`: fill in the code marked NotImplementedError, then run `python -m grader`. (stub digest 71bbcbdb85a1)
"""Puzzle 9 — Mixed precision with dynamic loss scaling.

The task: write `MixedPrecisionAdam`, which trains puzzle 8's model with a float16 forward and backward, float32
master weights and Adam, and a loss scale that adapts. Six steps; the fourth one's gradients overflow float16.
The checks, with their numbers (sizes: d=32, h=64, L=2 blocks, so Ψ = 2·L·d·h = 8,192 weights; batch 32):
  - weights after each step: the float32 master weights after each of the 6 steps within 1e-6 of a serial
    reference computed in the same precisions, each step's forward run on the float16 copies of your own masters
    (tolerance 1e-6 x max(1, largest |expected|); why: below), and the float16 weights, after __init__ and after
    each step, exactly your master weights rounded to float16.
  - skipped step: step 4 changes nothing: the master weights, the float16 weights and every tensor of more than
    one number that your optimizer keeps (Adam's m and v) are bit for bit what they were before it.
  - loss scale: get_scale() after each step is 1,024, 2,048, 2,048, 1,024, 1,024, 2,048.
  - both again in a second run, on a fresh optimizer and the first three batches, the second made to overflow:
    step 2 changes nothing and the scales are 1,024, 512, 512 (the overflow is found from the gradients, not
    from the step's number).
  - parameter bytes: right after the first step, the bytes your rank holds for the parameters are exactly
    16·Ψ = 131,072 bytes (+ 1,024 for scalars): 2 + 2 + 4 + 4 + 4 = 16 bytes per weight.

Why float16. Half the bytes of float32 for every activation and every message, and on a GPU, tensor cores that
multiply float16 matrices many times faster. The price is range and precision: float16 has 10 bits of mantissa
(about 3 decimal digits), its largest number is 65,504, and below 6.1e-5 it loses precision until, under 6e-8,
everything is zero. So mixed precision (Micikevicius et al., 2018) keeps two copies of the weights:

    float32 master weights --copy--> float16 weights --forward, backward (float16)--> float16 gradients
          ^                                                                              |
          +---- Adam, in float32 (m, v float32) <---- unscale: float32(grad) / scale <---+

  - the forward and backward run in float16, on float16 copies of the weights;
  - the update runs in float32, on the master weights: added to a weight of 0.3 in float16 (spacing 2.4e-4
    there), an update of 1e-4 would be rounded away entirely, and one of 1e-3 rounded to a multiple of 2.4e-4;
  - the loss is computed in float32 (as torch.autocast does) and multiplied by the *loss scale* S before
    backward, so every gradient comes out S times larger: small gradients that would underflow float16 are
    lifted into its range. Before the update, divide them by S again (unscale), in float32.
Too large an S makes gradients overflow (inf, or NaN from inf - inf). Dynamic loss scaling (torch.amp.GradScaler)
finds S as it goes: when any unscaled gradient is not finite, skip the step (no update at all: weights, m, v and
Adam's step count stay as they were) and halve S; after `growth_interval` steps in a row without overflow,
double S. With S0 = 1,024 and growth_interval = 2, the six steps go:

    step            1        2        3          4           5        6
    scale used      1,024    1,024    2,048      2,048       1,024    1,024
    gradients       finite   finite   finite     overflow    finite   finite
    what happens    Adam     Adam,    Adam       skipped,    Adam     Adam,
                             S x 2               S / 2                S x 2
    get_scale()     1,024    2,048    2,048      1,024       1,024    2,048
    Adam's t        1        2        3          3           4        5

Step 4's batch has targets 10,000 times larger than the others: its gradients, times the scale, are far beyond
65,504 whatever the seed (the grader checks that it overflows and the others do not).

Memory, per weight (the ZeRO paper's accounting): float16 weights 2 bytes + float16 gradients 2 + float32 master
weights 4 + Adam's m 4 + v 4 = 16 bytes, 16·Ψ = 131,072 bytes here. Mixed precision saves no parameter memory
(float32 training with Adam needs 4 + 4 + 4 + 4 = 16 bytes too): it saves activation memory and time. So the
grader measures the parameters alone: at a moment when no activation is alive (right after step(), when backward
has freed the graph), with the float16 gradients still in w.grad (as after torch's optimizer.step()). The
activations of the first forward are measured too, and shown beside, not counted.

Write the class `MixedPrecisionAdam`:
  - `MixedPrecisionAdam(layers, lr, betas, eps, init_scale, growth_interval)`: `layers` are the float32 master
    weights, a list of 2 pairs (w1 [32, 64], w2 [64, 32]): keep them as the master weights and update them in
    place (they are what the grader reads). Make `self.half_layers`, float16 copies in the same structure, with
    requires_grad (the grader runs the forward on them), and Adam's m and v, float32 zeros.
  - `scale(loss)`: the float32 loss times the current loss scale (the grader calls `.backward()` on it).
  - `step()`: unscale the float16 gradients (in w.grad of the float16 weights) into float32; if any is not finite,
    skip the step and halve the scale; else update the master weights with Adam exactly as torch.optim.Adam does
    (no weight decay, with bias correction; t = the number of steps taken, 1 at the first, a skipped step not
    counted), copy them into the float16 weights in place, and count the good step (double the scale after
    `growth_interval` good steps in a row, as torch.amp.GradScaler does, and start counting again). Leave w.grad
    alone: the grader clears it. This is GradScaler's step(optimizer) and update() in one.
  - `get_scale()`: the current loss scale, a number (GradScaler's get_scale()).
What the grader runs, 6 times, one batch each (x: float16 [32, 32], target: float32 [32, 32]):

    y = forward(x, opt.half_layers)                  # float16 (puzzles.model.forward)
    loss = loss_fn(y.float(), target)                # float32
    opt.scale(loss).backward()                       # float16 gradients in w.grad of opt.half_layers
    opt.step()
    ... then w.grad = None for every float16 weight

Adam's constants: lr = 0.001, betas = (0.9, 0.999), eps = 1e-8; loss scale: init_scale = 1,024, growth factor 2,
backoff factor 0.5, growth_interval = 2 (GradScaler's defaults, but for the initial scale and the interval).

The simulated machine: the puzzles' GPU (README, "The clock"): every op costs max(FLOPs / 1,024, bytes / 2,048)
+ 4 ticks, and float16 arithmetic is twice as fast (a GPU's tensor cores in small) on half the bytes. No time
budget here: the clock is for the chart.

Checks, in detail:
  - weights after each step. The reference is torch.optim.Adam on the float32 masters, with GradScaler's dynamic
    loss scaling (torch.amp.GradScaler's, bit for bit) deciding the skip and the scale, on the same float16 forward
    and backward. Each step's forward runs on the float16 copies of *your* master weights after the step before
    (teacher forcing), so each step is judged on the gradients your own weights give. Why: Adam's arithmetic written
    another way (m / (1 - beta1^t) first, a flat vector, another order of the same float32 operations) rounds
    differently in the last bit, and now and then that moves a float16 copy of a weight across a rounding boundary,
    which changes the next forward; Adam, dividing by sqrt(v), can make a visible change of that. Run on their own,
    correct answers in other styles drift up to 1.15e-5 from the reference (measured, 1,000 seeds), about a tenth of
    the closest mistake (counting the skipped step in Adam's t: 1.04e-4). Forced, they stay within 6e-8, and every
    mistake replayed at least 1.04e-4 away: 1e-6 sits between (bench/RESULTS.md). That forcing is fair needs the
    float16 weights to be the masters rounded, which is checked bit for bit.
  - skipped step: read around step 4's step() call: every tensor your optimizer object holds (walked through its
    attributes, lists and dicts, a torch.optim.Adam inside it included) of more than one number, and the master
    weights, unchanged. A scalar such as the scale or a counter may change; a tensor kept from one step to the
    next (the last gradients, an unscaled copy of them) counts as state, so keep such things local to step().
  - loss scale: as in the table above.
  - parameter bytes: the bytes held right after the first step() returns, beyond the batches (which the grader
    placed on the rank), at least 16·Ψ = 131,072 and at most 16·Ψ + 1,024 = 132,096.
  - keep everything as torch tensors (the grader refuses a tensor turned into a numpy array, a Python list or
    bytes, which its memory ledger could not see).

Hints:
  - `w.grad.float() / s` unscales in float32; `torch.isfinite(g).all()` says whether g has no inf and no NaN.
  - Under `torch.no_grad()`, `h.copy_(w)` writes a float32 tensor into a float16 one, rounding, in place.
  - A skipped step returns before touching anything but the scale and the count of good steps.
"""

import torch


class MixedPrecisionAdam:
    def __init__(self, layers, lr, betas, eps, init_scale, growth_interval):
        raise NotImplementedError("p9: write MixedPrecisionAdam.__init__")

    def scale(self, loss):
        raise NotImplementedError("p9: write MixedPrecisionAdam.scale")

    def step(self):
        raise NotImplementedError("p9: write MixedPrecisionAdam.step")

    def get_scale(self):
        raise NotImplementedError("p9: write MixedPrecisionAdam.get_scale")
