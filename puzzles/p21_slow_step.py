# Generated from solutions/p21_slow_step.py by `python -m grader build`: fill in the code marked NotImplementedError, then run `python -m grader`. (stub digest fdc684942078)
"""Puzzle 21 — The slow step: host syncs, a synchronous all-reduce and a loader that does not overlap.

The task: `train` below, as handed to you, trains correctly but about twice as slowly as it should. Find out where
the time goes with the trace (`python -m grader check puzzles -p p21 --trace p21.json`, opened in Perfetto: each
rank's compute stream, its communication queue, its host and its loader's workers), and fix it so that the run
meets its time budget, with the same weights and the same logged losses. The checks (4 ranks; S = 6 steps of data
parallel SGD, lr = 0.005; L = 4 blocks, d = 64, h = 256; b = 8 rows per rank and step):
  - weights: every rank's weights after the S steps equal S SGD steps of the serial model on the whole batch of
    each step (its 4·8 rows), the loss averaged over them (float64, 1e-8 relative).
  - logged losses: `train` returns a tensor of the S losses, on every rank, each the whole batch's loss at the
    weights before its step.
  - data loaded: every rank loads its S·b = 48 samples through the dataset it is given (each takes τ = 1,500
    ticks, by the host or a worker; reading `dataset.tensors` directly loads nothing, which no real job can do).
  - no host sync: the host never waits for the device in `train` (torch.cuda.set_sync_debug_mode("error") would
    raise at the same lines: `.item()`, `float(t)`, `.tolist()`, `.cpu()`, printing a tensor, `x[mask]`, ...).
  - communication: the bytes each rank sends, at most S·2(N-1)/N·G + 1 KiB = 6 x 1,572,864 + 1,024 = 9,438,208
    bytes (G = 2·L·d·h·8 = 1,048,576 bytes, each step's gradients once; 1 KiB for scalars such as the losses).
  - overlap: the communication during which a rank's compute stream runs nothing (or only copies), at most
    S·2A = 6 x 2 x 816 = 9,792 ticks: in each step at most two blocks' all-reduces left with nothing under them
    (the last block's gradients are written last; the rest run under the backward).
  - makespan: the whole run, at most b·τ + S·(C + A) + T = 12,000 + 6 x (9,987 + 816) + 2,996 = 79,814 ticks,
    where b·τ = 8 x 1,500 is the first batch's load (nothing runs before it), C = FB + U = 6,307 + 3,680 = 9,987
    ticks a step's compute (puzzle 7's: its forward and backward, and its update, each gradient averaged in
    place, scaled by lr and subtracted: an update that folds 1/N into lr costs less), A = 816 ticks one block's
    all-reduce (puzzle 7's), and T = 5% of S·C. The program as handed out takes about 134,000 ticks.

The symptom, as a real job shows it: the GPUs' utilisation hovers at half, and the step time in the log is twice
what the model's FLOPs predict. Nothing fails. The tools that show why: the **profiler** (torch.profiler, each
rank's CPU and CUDA timelines side by side: `cudaStreamSynchronize` or `aten::_local_scalar_dense` on the CPU
row while the GPU row is empty, the data loader's `__next__` between steps, NCCL kernels after the backward's
last kernel), torch.cuda.set_sync_debug_mode in its "warn" mode (a warning at every line that makes the host wait), and
Nsight Systems. Here, --trace is that profiler: a rank's "host" track shows each sync (from the moment the host
waits to the moment it has its number, with the line that asked) and each batch the host loads itself; the
"loader" tracks show the workers' batches; the compute and communication tracks show what the device did. One
step of the program as handed out, in the shape the trace shows it (not to scale):

    host      |launch F, B|launch all-reduces, U|loss.item() waits...|load the next batch........|launch F
    compute   |F     B    |                     |U                   |                           |F
    comm                  |AR AR AR AR AR AR AR |

Each row waits on another: the device for the host's launches and for its batch, the network for the whole
backward, the host for the device's last op.

The machine. The host launches each op in 8 ticks and runs ahead of the device until it needs a number from it:
then it waits for the device's queue to empty, plus 40 ticks for the copy back, and the device idles until the
host has launched the next op. A sample takes τ = 1,500 ticks of a CPU core to load (decode, augment), a batch of
b = 8 of them 12,000 ticks: longer than a step's compute. With `num_workers=0` the host loads each batch itself
and launches nothing meanwhile; with W workers, the loader hands out prefetch_factor·W batches when the loop
starts and one more each time the loop takes one, and the workers load them in the background (torch's
DataLoader, as sim.DataLoader mirrors it). The compute and the network are puzzle 7's: the puzzles' GPU; alpha =
8 ticks per ring step, 512 bytes per tick.

The three causes, and what each looks like in the trace:
  - a sync per step: `loss.item()` to log the loss makes the host wait for the whole step, so the next batch's
    load and launches start only once the device is idle: the device then waits for both. Keep the losses on the
    device (a tensor per step) and return them as a tensor: whoever logs them reads them later, off the loop.
  - a loader that does not overlap: with num_workers=0 the device idles while the host loads, as soon as the host
    is not far enough ahead; workers (enough of them that a batch loads faster than a step computes) load the
    next batches during this one.
  - a synchronous all-reduce: all-reducing the gradients after the whole backward leaves the network idle during
    backward and the compute idle during the all-reduces (puzzle 7): launch each gradient's all-reduce as soon
    as backward has written it (`register_post_accumulate_grad_hook`, `async_op=True`), and wait before the update.
No one of them alone brings the run under the budget; a workaround that hides a cause (skipping the log, loading
every batch before the loop) leaves the others, or fails the weights or the losses.

Write `train(dist, dataset, layers, lr)`:
  - `dataset`: this rank's rows, a sim.TensorDataset of (x [48, 64], target [48, 64]) whose samples each take τ to
    load: S batches of b = 8 rows, in order (no shuffling);
  - `layers`: the rank's replica of the weights, [(w1 [64, 256], w2 [256, 64])] x 4, requires_grad;
  - for each batch: `loss_fn(forward(x, layers), target)`, its gradients averaged over the ranks, one SGD step
    (`w -= lr * grad` under torch.no_grad(), every weight, every rank), `w.grad` cleared for the next step;
  - return the S logged losses as one tensor [S]: each the mean of the ranks' losses (the whole batch's loss).

Hints:
  - `DataLoader(dataset, batch_size=8, num_workers=2, prefetch_factor=2)`: two workers load a batch in 12,000
    ticks each, so one arrives every 6,000, faster than a step.
  - `losses.append(loss.detach())`, then `torch.stack(losses)` and one all-reduce of it at the end: no sync.
  - Puzzle 7's hooks: keep the work handles, `wait()` on each after backward, remove the hooks before returning.
"""

import torch

from puzzles.model import forward, loss_fn
from puzzles.sim import DataLoader

BATCH = 8  # rows per rank and step


def train(dist, dataset, layers, lr):
    raise NotImplementedError("p21: this run is twice as slow as it should be: delete this line to run it as handed out, then fix it")
    world = dist.get_world_size()
    weights = [w for pair in layers for w in pair]
    losses = []
    for x, target in DataLoader(dataset, batch_size=BATCH):  # the host loads each batch itself
        loss = loss_fn(forward(x, layers), target)
        loss.backward()
        for w in weights:
            dist.all_reduce(w.grad)  # after the whole backward: nothing overlaps it
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        losses.append(logged.item() / world)  # the step's loss, for the log
        with torch.no_grad():
            for w in weights:
                w -= lr / world * w.grad
                w.grad = None
    return torch.tensor(losses, dtype=torch.float64)
