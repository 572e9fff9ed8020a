"""The code a story invites a learner to type runs, in the context the story describes (issue 30: p13's hint,
followed as written, raised a TypeError). tests/story_code.py says what counts as code and how it runs; here is
each puzzle's context: the names its story gives, made as it describes them, on every rank of a simulated world.

A story that gains a span of code gains, when the span names something new, that name here. A span that is not
code to type (tests/story_code.py lists the kinds) needs nothing.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

import pytest

from grader.backends.learner_code import load_module
from grader.frontends.targets import REPO
from grader.specs import SPECS
from puzzles import sim

from story_code import Span, docstrings, examples, kind, run_examples, run_spans, spans_in


@dataclass
class Context:
    """What a puzzle's story says its names are. `setup` runs on every rank of a world of `world` ranks (`dist`
    given), in the names of the puzzle's reference solution (its imports, its functions and classes); `around`
    wraps a span in what the story says surrounds it: "with torch.no_grad():\\n    {code}"."""

    setup: str
    world: int = 1
    around: dict[str, str] = field(default_factory=dict)


NO_GRAD = "with torch.no_grad():\n    {code}"
PRELUDE = """
import io, types, zlib
import torch
import torch.nn.functional as F
from puzzles import model
N, rank = dist.get_world_size(), dist.get_rank()
r = rank
"""

# The pipeline puzzles' names, indented as the contexts' own lines are (they are joined to them).
MICROBATCHES = """
        layers = model.init_layers(2, 64, 256, seed=0)
        x, target = model.make_batch(64, 64, seed=0)
        n_micro, micro_shape, i, c = 8, (8, 64), 3, 1
        a = torch.randn(micro_shape, dtype=torch.float64).requires_grad_()   # a stage's input, received
        y = model.forward(a, layers)                                          # the stage's output
        target_i = target.chunk(n_micro)[i]
        g = torch.ones(micro_shape, dtype=torch.float64)                      # the gradient received for y
"""

CONTEXTS = {
    "p1": Context("""
        x = torch.randn(16, 32, dtype=torch.float64)
        w1 = torch.randn(32, 128, dtype=torch.float64, requires_grad=True)
        w2 = torch.randn(128, 32, dtype=torch.float64, requires_grad=True)
        gelu = F.gelu
        c = x                                              # a checkpoint: a block's input, kept
        out = model.block(c.detach().requires_grad_(), w1, w2)   # a segment recomputed with the graph
        g = torch.ones_like(out)                           # the gradient of the segment's output
        """),
    "p2": Context("""
        B, d = 256, 32
        c = torch.randn(B, d, dtype=torch.float64)         # a checkpoint
        t = c
        shard = c.chunk(N)[rank].clone()
        full = torch.empty(B, d, dtype=shard.dtype)
        """, world=4),
    "p3": Context("""
        layers = model.init_layers(4, 64, 256, seed=0)
        x_shard, target_shard = model.make_batch(8, 64, seed=rank)
        loss_fn(forward(x_shard, layers), target_shard).backward()
        loss = loss_fn(forward(x_shard, layers), target_shard)      # this step's loss, not yet backpropagated
        w, lr = layers[0][0], 0.1
        t = w.grad
        """, world=4, around={"w -= lr * w.grad": NO_GRAD}),
    "p4": Context("""
        x = torch.randn(8, 64, dtype=torch.float64, requires_grad=True)
        w1_r = torch.randn(64, 64, dtype=torch.float64, requires_grad=True)   # this rank's columns of w1
        w2_r = torch.randn(64, 64, dtype=torch.float64, requires_grad=True)   # the matching rows of w2
        f = lambda t: CopyToTensorParallel.apply(t, dist)
        g = lambda t: ReduceFromTensorParallel.apply(t, dist)
        gelu = F.gelu
        partial = torch.randn(8, 64, dtype=torch.float64)
        y, target = torch.randn(8, 64, dtype=torch.float64, requires_grad=True), torch.randn(8, 64, dtype=torch.float64)
        t = torch.ones(8, 64, dtype=torch.float64)
        ctx, grad = types.SimpleNamespace(dist=dist), torch.ones(8, 64, dtype=torch.float64)
        backward = ReduceFromTensorParallel.backward       # "In `backward(ctx, grad)`": g's, say
        loss_fn = model.loss_fn
        """, world=4),
    "p5": Context(MICROBATCHES),
    "p6": Context(MICROBATCHES + """
        peer = rank ^ 1                                     # a neighbour: ranks 0 and 1 exchange, 2 and 3
        t, buf = torch.randn(micro_shape, dtype=torch.float64), torch.empty(micro_shape, dtype=torch.float64)
        """, world=4, around={
            "dist.batch_isend_irecv([dist.P2POp(dist.isend, t, peer), dist.P2POp(dist.irecv, buf, peer)])":
                "for work in {code}:\n    work.wait()"}),
    "p7": Context("""
        layers = model.init_layers(4, 64, 256, seed=0)
        x_shard, target_shard = model.make_batch(8, 64, seed=rank)
        loss_fn(forward(x_shard, layers), target_shard).backward()
        w, lr = layers[0][0], 0.1
        work = dist.all_reduce(w.grad, async_op=True)
        hook = lambda w: None                               # what the learner registers
        """, world=4, around={"w -= lr * w.grad": "work.wait()\n" + NO_GRAD,
                              "w -= lr / N * w.grad": "work.wait()\n" + NO_GRAD,
                              "hook(w)": "work.wait()\n{code}",
                              "w.register_post_accumulate_grad_hook(hook)": "work.wait()\n{code}.remove()",
                              "loss_fn(forward(x_shard, layers), target_shard)": "work.wait()\n{code}",
                              "dist.get_world_size()": "work.wait()\n{code}",
                              "torch.no_grad()": "work.wait()\n{code}"}),
    "p8": Context("""
        layers = model.init_layers(2, 32, 64, seed=0)
        x, target = model.make_batch(8, 32, seed=rank)
        model.loss_fn(model.forward(x, layers), target).backward()
        opt = ShardedAdam(dist, layers, 0.01, (0.9, 0.999), 1e-8)
        flat = torch.cat([w.reshape(-1) for pair in layers for w in pair]).detach()
        lo, hi = rank * flat.numel() // N, (rank + 1) * flat.numel() // N
        inp, out = flat, torch.empty(hi - lo, dtype=torch.float64)          # reduce-scatter: Ψ in, Ψ/N out
        """, world=4, around={"dist.all_gather_into_tensor(out, inp)": "inp, out = out, inp\n{code}"}),
    "p9": Context("""
        layers = [(w1.detach().float(), w2.detach().float()) for w1, w2 in model.init_layers(2, 32, 64, seed=0)]
        x, target = model.make_batch(8, 32, seed=0)
        opt = MixedPrecisionAdam(layers, 1e-3, (0.9, 0.999), 1e-8, 1024.0, 2)
        loss = model.loss_fn(model.forward(x.half(), opt.half_layers).float(), target.float())
        scale = opt.scale                                   # `scale(loss)`: the method
        opt.scale(loss).backward()
        w, s = opt.half_layers[0][0], opt.get_scale()       # a float16 weight with its gradient; the scale
        g = w.grad.float() / s
        h, master = opt.half_layers[0][0], layers[0][0]
        """, around={"h.copy_(w)": "w = master\n" + NO_GRAD}),
    "p10": Context("""
        d, h_, L = 64, 256, 4
        w1, w2 = torch.randn(d, h_, dtype=torch.float64), torch.randn(h_, d, dtype=torch.float64)
        flat = torch.cat([w1.reshape(-1), w2.reshape(-1)])
        shards = [flat.chunk(N)[rank].clone() for _ in range(L)]
        full = torch.empty(2 * d * h_, dtype=torch.float64)
        buffers, i, j = [full, torch.empty_like(full)], 0, 3
        x, target = model.make_batch(4, 64, seed=rank)
        y, lr = x.clone(), 0.1
        loss_fn = model.loss_fn
        work = dist.all_gather_into_tensor(torch.empty_like(full), shards[0], async_op=True)
        """, world=4, around={
            "work = dist.all_gather_into_tensor(full, shards[i], async_op=True)": "work.wait()\n{code}\nwork.wait()",
            **{code: "work.wait()\n{code}" for code in ("layer_weights(flat)", "torch.cat([w1.reshape(-1), "
               "w2.reshape(-1)])", "loss_fn(y, target)", "buffers[j % 2]")}}),
    "p11": Context("""
        tp_group, dp_group, pp_group = build_3d_groups(dist)
        group, groups, ranks = tp_group, (tp_group, dp_group, pp_group), [0, 1]
        t = torch.ones(4, dtype=torch.float64)
        x, target = model.make_batch(16, 32, seed=0)
        n_micro, micro_shape, i = 4, (4, 32), 1
        a = torch.randn(micro_shape, dtype=torch.float64, requires_grad=True)
        w1_r = torch.randn(32, 64, dtype=torch.float64, requires_grad=True)
        w2_r = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
        f = lambda t: CopyToTPGroup.apply(t, dist, tp_group)
        g = lambda t: ReduceFromTPGroup.apply(t, dist, tp_group)
        gelu = F.gelu
        partial, y = torch.randn(micro_shape, dtype=torch.float64), torch.randn(micro_shape, dtype=torch.float64)
        """, world=8),
    "p12": Context("""
        E, capacity = 8, 3
        x = torch.randn(16, 64, dtype=torch.float64, requires_grad=True)
        router = torch.randn(64, E, dtype=torch.float64)
        probs = torch.softmax(x.detach() @ router, dim=-1)
        gate, choice = probs.max(dim=-1)
        onehot = F.one_hot(choice, E)
        position = (onehot.cumsum(0) * onehot).sum(1) - 1
        kept = position < capacity
        kept_rows = kept.nonzero().squeeze(1)
        p = gate[kept_rows].unsqueeze(1)
        results = torch.randn(len(kept_rows), 64, dtype=torch.float64)
        counts = torch.bincount(choice[kept], minlength=E)
        input_split_sizes = output_split_sizes = [4, 4, 4, 4]          # rows to and from each rank
        output = torch.empty(16, 64, dtype=torch.float64)
        y, target = torch.randn(16, 64, dtype=torch.float64), torch.randn(16, 64, dtype=torch.float64)
        loss_fn = model.loss_fn
        """, world=4),
    "p13": Context("""
        t = torch.arange(16, dtype=torch.float64) + 100 * rank
        right, left = (rank + 1) % N, (rank - 1) % N
        chunks = t.view(-1).chunk(N)
        j, buf = 1, torch.ones_like(chunks[0])
        send_chunk = chunks[rank]
        """, world=4, around={
            "works = [dist.isend(send_chunk, right), dist.irecv(buf, left)]": "{code}\nfor w in works:\n    w.wait()",
            "for w in works: w.wait()": "works = [dist.isend(send_chunk, right), dist.irecv(buf, left)]\n{code}"}),
    "p14": Context("""
        from grader.specs.p14_sequence_parallel.layout import sequence_loss
        b, s, d, n_heads = 2, 32, 64, 8
        x = torch.randn(b, s // N, d, dtype=torch.float64, requires_grad=True)   # this rank's tokens
        x_r, t = x, torch.randn(b, s, d, dtype=torch.float64)
        chunks = sequence_chunks(t, N)
        partial = torch.randn(b, s, d, dtype=torch.float64)
        mine = torch.empty((b, s // N, d), dtype=torch.float64)
        n = torch.randn(b, s, d, dtype=torch.float64)                           # the norm's output, gathered
        w = model.TransformerWeights(
            norm1=torch.ones(d, dtype=torch.float64, requires_grad=True),
            wqkv=torch.randn(d, 48, dtype=torch.float64), wo=torch.randn(16, d, dtype=torch.float64),
            norm2=torch.ones(d, dtype=torch.float64), w1=torch.randn(d, 64, dtype=torch.float64),
            w2=torch.randn(64, d, dtype=torch.float64))
        y, target_r = torch.randn(b, s // N, d, dtype=torch.float64), torch.randn(b, s // N, d, dtype=torch.float64)
        ctx, grad = types.SimpleNamespace(), torch.ones(d, dtype=torch.float64)
        grad_x = torch.ones(b, s // N, d, dtype=torch.float64)
        fn = lambda grad: grad
        """, world=4, around={"dist.all_gather_into_tensor(chunks, x.contiguous())": NO_GRAD}),  # a Function's forward
    "p15": Context("""
        b, heads, c_, hd = 1, 2, 4, 8
        q, k, v = (torch.randn(b, heads, 2 * c_, hd, dtype=torch.float64, requires_grad=True) for _ in range(3))
        tensor = torch.randn(b, heads, 2 * c_, hd, dtype=torch.float64)
        """, world=4),
    "p16": Context(MICROBATCHES + """
        chunks = [model.init_layers(1, 64, 256, seed=0), model.init_layers(1, 64, 256, seed=1)]
        """, world=1),
    "p17": Context(MICROBATCHES),
    "p18": Context("""
        from puzzles.sim import Disk
        files = Disk().mount(dist)  # p18's harness mounts the job's disk before the learner's code runs
        state = types.SimpleNamespace(generator=torch.Generator().manual_seed(0))
        t = state.generator.get_state()
        obj = {"step": 4, "master": torch.ones(8)}
        buf = io.BytesIO(); torch.save(obj, buf); data = buf.getvalue()
        crc, size = zlib.crc32(data), len(data)
        out = torch.empty(2 * N, dtype=torch.int64)
        """, world=4),
    "p19": Context("""
        made = {pair: dist.new_group(list(pair)) for pair in ((0, 1), (2, 3), (0, 2), (1, 3))}  # every rank, in order
        tp_group, dp_group = made[(rank & 2, rank | 1)], made[(rank & 1, (rank & 1) + 2)]      # rank = tp + 2·dp
        group = dp_group
        inp, out = torch.randn(8, dtype=torch.float64), torch.empty(4, dtype=torch.float64)
        norm = torch.tensor(float("inf"))
        """, world=4, around={"dist.all_gather_into_tensor(out, inp, group=dp_group)": "inp, out = out, inp\n{code}"}),
    "p20": Context("""
        from torch.profiler import record_function
        x, target = model.make_batch(8, 32, seed=0)
        valid = torch.tensor([True, False] * 4)
        layers, lr, run, s = model.init_layers(2, 32, 64, seed=0), 0.05, "A", 2
        n = int(valid.sum())
        w = layers[0][0]
        loss = ((model.forward(x[valid], layers) - target[valid]) ** 2).sum() / n
        """, world=4, around={"w -= lr * w.grad": "w.grad = torch.ones_like(w)\n" + NO_GRAD}),
    "p21": Context("""
        from puzzles.sim import DataLoader, TensorDataset
        x, target = model.make_batch(48, 64, seed=rank)
        dataset = TensorDataset(x, target, ticks_per_sample=1500)
        layers, lr = model.init_layers(4, 64, 256, seed=0), 0.005
        loss = model.loss_fn(model.forward(x[:8], layers), target[:8])
        losses, t, mask = [loss.detach()], loss.detach(), torch.arange(48) % 2 == 0
        w = layers[0][0]
        w.grad = torch.ones_like(w)
        grad = w.grad
        """, world=4, around={"w -= lr * grad": NO_GRAD}),
    "p22": Context("""
        layers = [(w1.float(), w2.float()) for w1, w2 in model.init_layers(2, 32, 64, seed=0)]
        x, target = (t.float() for t in model.make_batch(8, 32, seed=rank))
        x[1, 3] = float("nan")
        keep = torch.isfinite(x).all(dim=1)
        y = model.forward(x[keep].half(), [(w1.half(), w2.half()) for w1, w2 in layers])
        per_row = ((y.float() - target[keep]) ** 2).sum(dim=1)
        scale, lr = 64.0, 0.2
        w = layers[0][0]
        g = torch.ones_like(w)
        stats = torch.stack([per_row.detach().sum(), keep.sum().float()])
        loss, logged = per_row.sum() / keep.sum(), []
        log = logged.append
        """, world=4, around={"w -= lr * g": NO_GRAD}),
    "p23": Context("""
        from puzzles.sim import cuda
        from grader.specs.p23_straggler.layout import StepBatch
        B, world = 88, dist.get_world_size()
        batch = StepBatch(*model.make_batch(B, 64, seed=0))
        lo, hi = 24 * rank, 24 * rank + 16
        x, target = batch[lo:hi]
        layers, lr = model.init_layers(2, 64, 256, seed=0), 0.01
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record(); end.record()
        mine = torch.tensor([start.elapsed_time(end) + 1.0], dtype=torch.float64)
        times = torch.ones(world, dtype=torch.float64)
        w = layers[0][0]
        w.grad = torch.ones_like(w)
        """, world=4, around={"w -= lr * w.grad": NO_GRAD}),
}


def solution_of(puzzle: str):
    return REPO / "solutions" / SPECS[puzzle].filename


def code_spans(puzzle: str) -> list[Span]:
    """The spans of the puzzle's docstrings and its spec's hints that are code to type, each once."""
    spec = SPECS[puzzle]
    found = [s for where, text in docstrings(solution_of(puzzle).read_text()) for s in spans_in(text, where)]
    found += [s for n, hint in enumerate(spec.hints, 1) for s in spans_in(hint, f"the spec's hint {n}")]
    unique = {}
    for s in found:
        if kind(s.code, spec.entries) == "run":
            unique.setdefault(s.code, s)
    return list(unique.values())


def run_in_context(puzzle: str, spans: list[Span], context: Context) -> None:
    names = vars(load_module(solution_of(puzzle)))

    def rank(dist):
        run_spans(spans, PRELUDE + textwrap.dedent(context.setup), {**names, "dist": dist},
                  context.around)

    sim.run(rank, world_size=context.world)


@pytest.mark.parametrize("puzzle", list(SPECS))
def test_every_span_of_code_in_the_story_and_the_hints_runs_where_the_story_puts_it(puzzle):
    assert puzzle in CONTEXTS, f"{puzzle} has no context in tests/test_story_code.py: give it the names its story uses"
    spans = code_spans(puzzle)
    run_in_context(puzzle, spans, CONTEXTS[puzzle])
    unused = set(CONTEXTS[puzzle].around) - {s.code for s in spans}
    assert not unused, f"CONTEXTS[{puzzle!r}].around wraps spans the story no longer has: {sorted(unused)}"


@pytest.mark.parametrize("puzzle", list(SPECS))
def test_every_example_in_the_story_shows_what_it_does(puzzle):
    names = vars(load_module(solution_of(puzzle)))
    for where, text in docstrings(solution_of(puzzle).read_text()):
        failures, report = run_examples(text, names, f"{puzzle}: {where}")
        assert failures == 0, report


def test_p13s_old_hint_is_caught():
    """The hint the issue reports, as a story would hold it now: run, it raises, and the test names the span."""
    old = Span("chunks = t.view(-1).chunk(N); chunks[j] += buf", "the story")
    with pytest.raises(Exception, match=r"`chunks = t\.view\(-1\)\.chunk\(N\); chunks\[j\] \+= buf` \(the story\) "
                                        r"raised TypeError: 'tuple' object does not support item assignment"):
        run_in_context("p13", [old], CONTEXTS["p13"])


def test_an_example_whose_output_is_not_what_it_shows_fails():
    text = """Hints:
  - chunks are views:

        >>> t = torch.zeros(4, dtype=torch.float64)
        >>> t.view(-1).chunk(2)[1].add_(1.0)
        tensor([1., 1.], dtype=torch.float64)
        >>> t
        tensor([0., 0., 0., 0.], dtype=torch.float64)
"""
    failures, report = run_examples(text, {"torch": __import__("torch")}, "p13")
    assert failures == 1 and "tensor([0., 0., 1., 1.], dtype=torch.float64)" in report, report
    assert len(examples(text)) == 3


@pytest.mark.parametrize("code, expected", [
    ("chunks = t.view(-1).chunk(N)", "run"), ("dist.all_reduce(t, op=dist.ReduceOp.AVG)", "run"),
    ("return grad, None", "run"), ("x.chunk(n_micro)[i]", "run"),
    ("checkpointed_forward(x, layers, k) -> (saved, y)", "words"), (".clone()", "words"), ("dst=", "words"),
    ("loss_fn(forward(x, all layers), target)", "words"), ("w.grad", "a name"), ("torch.optim.Adam", "a name"),
    ("step()", "a method named"), ("dtype=...", "a template"), ("dist.all_reduce(s, group=...)", "a template"),
    ("async_op=True", "a keyword"), ("raise NotImplementedError", "a raise"),
    ("gpipe_step(dist, layers, x, target, n_micro, micro_shape)", "a signature"),
])
def test_what_counts_as_code_to_type(code, expected):
    assert kind(code, entries=("gpipe_step",)) == expected


def test_a_span_is_found_in_the_text_not_in_an_example():
    text = "Use `a.add_(b)`\nacross `x.view(\n    -1)`:\n\n    >>> `not a span`\n    `output, not a span`\n\nafter `y`"
    assert [s.code for s in spans_in(text, "the story")] == ["a.add_(b)", "x.view( -1)", "y"]


def test_the_readmes_python_examples_run_and_print_what_they_say(capsys):
    """The README's ```python blocks are code to type too: each runs, and a `print(...)  # what it prints`
    prints that."""
    import re

    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    claims = 0
    for block in blocks:
        exec(compile(block, "<README.md>", "exec"), {})
        printed = capsys.readouterr().out.splitlines()
        said = [line.split("#", 1)[1].strip() for line in block.splitlines()
                if line.startswith("print(") and "#" in line]
        assert printed[len(printed) - len(said):] == said, (printed, said)
        claims += len(said)
    assert blocks and claims  # the simulator's example, and what sim.tally prints
