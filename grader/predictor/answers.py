"""A learner's answers inside the step at scale: which of them can run there, checked first on small tensors.

    puzzle 11 (3-D parallelism)        CopyToTPGroup (f) and ReduceFromTPGroup (g) take their group as an argument:
                                       they run as the tensor-parallel operators around every product of every
                                       layer, whatever the layout (without sequence parallelism)
    puzzle 14 (sequence parallelism)   GatherFromSequenceParallel and ReduceScatterToSequenceParallel work on the
                                       default group and on [b, s, d]: they run where one pipeline stage is the
                                       whole run and every tensor-parallel rank is simulated (--pipeline 1
                                       --simulate-tensor-ranks all), with a microbatch of 1 (then [s, b, d] and
                                       [b, s, d] are the same memory)
    the rest of each answer            three_d_step (an MLP, GPipe, float64 sizes of its own) and sp_forward
                                       (puzzle 14's two blocks) are built for the puzzles' sizes; the reference's
                                       model, pipeline schedule and optimizer run around the operators

Before an operator goes into a run of millions of ops it is checked on 2 simulated ranks with float64 tensors
(its values and gradients against what it must compute); a stub, an error or a wrong value leaves the
reference's operator in place, and the note says why.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from puzzles import sim

from .config import Config
from .gpt import LayerOps

P11 = "p11_three_d_parallel.py"
P14 = "p14_sequence_parallel.py"


def _load(folder: Path, filename: str):
    path = folder / filename
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(f"_at_scale_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def learner_ops(cfg: Config, folder: Path | None = None, namespace: dict | None = None):
    """(LayerOps or None, notes): the learner's operators that can run in `cfg`, from a folder of puzzle files
    or a notebook's globals."""
    def find(filename, names):
        if namespace is not None:
            return {n: namespace[n] for n in names if n in namespace}
        module = _load(folder, filename) if folder is not None else None
        return {n: getattr(module, n) for n in names if module is not None and hasattr(module, n)}

    notes = []
    par = cfg.parallel
    if par.sequence_parallel:
        found = find(P14, ("GatherFromSequenceParallel", "ReduceScatterToSequenceParallel"))
        if len(found) < 2:
            return None, ["puzzle 14's GatherFromSequenceParallel and ReduceScatterToSequenceParallel: not found "
                          "(puzzle 14 may not be in this copy); the reference's sequence parallelism runs"]
        if par.pipeline != 1 or cfg.stand_in or par.microbatch != 1:
            return None, ["your puzzle 14's operators work on the default group (all ranks) and on [b, s, d]: they "
                          "can run here only with --pipeline 1, --simulate-tensor-ranks all and a microbatch of 1; "
                          "the reference's sequence parallelism runs"]
        gather, scatter = found["GatherFromSequenceParallel"], found["ReduceScatterToSequenceParallel"]
        problem = _probe_sequence(gather, scatter)
        gather, scatter = on_device_of_input(gather), on_device_of_input(scatter)
        if problem:
            return None, [f"your puzzle 14's operators {problem}: the reference's sequence parallelism runs"]
        ops = LayerOps(gather=lambda x, tp: gather.apply(x.transpose(0, 1), tp.dist).transpose(0, 1),
                       reduce_scatter=lambda x, tp: scatter.apply(x.transpose(0, 1), tp.dist).transpose(0, 1))
        return ops, ["your puzzle 14's GatherFromSequenceParallel and ReduceScatterToSequenceParallel are the "
                     "sequence-parallel operators of every layer; the model, schedule and optimizer are the "
                     "reference's"]
    found = find(P11, ("CopyToTPGroup", "ReduceFromTPGroup"))
    if len(found) < 2:
        return None, ["puzzle 11's CopyToTPGroup and ReduceFromTPGroup: not found; the reference's tensor "
                      "parallelism runs"]
    f, g = found["CopyToTPGroup"], found["ReduceFromTPGroup"]
    problem = _probe_tensor(f, g)
    f, g = on_device_of_input(f), on_device_of_input(g)
    if problem:
        return None, [f"your puzzle 11's f and g {problem}: the reference's tensor parallelism runs"]
    return (LayerOps(copy_to=lambda x, tp: f.apply(x, tp.dist, tp.group),
                     reduce_from=lambda x, tp: g.apply(x, tp.dist, tp.group)),
            ["your puzzle 11's CopyToTPGroup (f) and ReduceFromTPGroup (g) are the tensor-parallel operators of "
             "every layer; the model, pipeline schedule and optimizer are the reference's (your three_d_step is an "
             "MLP with GPipe at the puzzle's sizes)"])


def on_device_of_input(function):
    """The learner's autograd.Function with its forward and backward run under the device of their first tensor
    as torch's default. A puzzle answer makes its buffers with torch.empty(shape, dtype=...) and no device (the
    puzzles' references do): at scale they must be meta tensors too (on the CPU they would be real gigabytes, and
    a collective cannot copy meta values into them). A default set around the step would not reach the backward,
    which autograd's engine runs outside it."""
    if function.setup_context is not torch.autograd.Function.setup_context:
        return function  # forward without ctx: left as it is

    class OnDeviceOfInput(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, *args):
            with torch.device(x.device):
                return function.forward(ctx, x, *args)

        @staticmethod
        def backward(ctx, *grads):
            with torch.device(next(g.device for g in grads if g is not None)):
                return function.backward(ctx, *grads)

    OnDeviceOfInput.__name__ = OnDeviceOfInput.__qualname__ = function.__name__
    return OnDeviceOfInput


def _run_probe(fn) -> str | None:
    """None if fn passes on 2 simulated ranks; else what went wrong, in a few words."""
    try:
        result = sim.run(fn, 2, timeout=30)
    except NotImplementedError:
        return "are not written yet (they raise NotImplementedError)"
    except Exception as exc:  # the learner's error, of any kind: the reference runs instead
        return f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    wrong = [r for r in result.results if r]
    return wrong[0] if wrong else None


def _probe_tensor(f, g) -> str | None:
    def program(dist):
        r = dist.get_rank()
        group = dist.new_group([0, 1])
        x = torch.full((3, 4), float(r + 1), dtype=torch.float64, requires_grad=True)
        y = g.apply(f.apply(x, dist, group) * (r + 1), dist, group)  # sum over ranks of (r+1)·x
        y.backward(torch.ones_like(y))
        if not torch.allclose(y, torch.full_like(y, 1.0 * 1 + 2.0 * 2)):
            return "compute the wrong forward sum on 2 ranks"
        if not torch.allclose(x.grad, torch.full_like(x, 3.0)):  # f's backward sums (1 + 2) over the ranks
            return "give the wrong gradient on 2 ranks"
        return None

    return _run_probe(program)


def _probe_sequence(gather, scatter) -> str | None:
    def program(dist):
        r = dist.get_rank()
        x = torch.arange(4 * 3, dtype=torch.float64).reshape(1, 4, 3) + 100 * r
        x.requires_grad_()
        full = gather.apply(x, dist)  # [1, 8, 3]: rank 0's tokens, then rank 1's
        expected = torch.cat([torch.arange(12, dtype=torch.float64).reshape(1, 4, 3) + 100 * i for i in range(2)], 1)
        if full.shape != expected.shape or not torch.allclose(full, expected):
            return "gather the wrong tokens on 2 ranks"
        mine = scatter.apply(full * (r + 1), dist)  # this rank's tokens of the sum over ranks: 3·expected
        if not torch.allclose(mine, 3 * expected[:, 4 * r: 4 * (r + 1)]):
            return "reduce-scatter the wrong tokens on 2 ranks"
        mine.sum().backward()
        if not torch.allclose(x.grad, torch.full_like(x, 3.0)):
            return "give the wrong gradient on 2 ranks"
        return None

    return _run_probe(program)
