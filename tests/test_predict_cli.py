"""`python -m grader predict`: the command, its report, trace and plots, and a learner's operators in the step."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from grader.predictor.runner import predict
from grader.frontends import cli
from grader.frontends.predict import config_from_args
from grader.predictor.report import coarse_events
from grader.predictor.answers import learner_ops
from grader.frontends.targets import REPO
from grader.predictor.presets import megatron

SMALL = ["--layers", "4", "--hidden", "64", "--heads", "4", "--seq", "64", "--vocab", "256", "--tensor", "2",
         "--pipeline", "2", "--microbatch", "1", "--global-batch", "4"]


def run_cli(capsys, *args):
    code = cli.main(["predict", *args]) if hasattr(cli, "main") else _run(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def _run(args):
    parsed = cli.parser().parse_args(["predict", *args])
    return parsed.func(parsed)


def test_predict_prints_the_step_and_its_memory(capsys, tmp_path):
    code, out, err = run_cli(capsys, *SMALL, "--sequence-parallel", "--recompute", "selective",
                             "--trace", str(tmp_path / "t.json"), "--plots", str(tmp_path / "plots"))
    assert code == 0, err
    for line in ("step time", "MFU", "compute idle", "weights", "gradients", "optimizer", "activations", "peak",
                 "compute matmul", "comm    all_gather_into_tensor"):
        assert line in out
    assert "2 simulated rank(s), one per stage, each standing for its 2 tensor-parallel GPUs" in out
    trace = json.loads((tmp_path / "t.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {0, 1}
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["predict_memory.png", "predict_schedule.png"]


def test_predict_json_holds_the_figures(capsys):
    code, out, err = run_cli(capsys, *SMALL, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["simulated_ranks"] == 2 and data["step_seconds"] > 0 and 0 < data["mfu"] < 1
    assert set(data["memory"][0]) >= {"weights", "gradients", "optimizer", "activations", "layer_activations", "peak"}


def test_a_long_pipeline_is_read_off_the_line_unless_every_microbatch_is_asked_for(capsys):
    """m = 8 on p = 2: runs of 2 and 4 microbatches, the same step as all 8 (the line is exact)."""
    many = [*SMALL[:-2], "--global-batch", "8", "--json"]
    code, out, err = run_cli(capsys, *many)
    assert code == 0, err
    line = json.loads(out)
    code, out, err = run_cli(capsys, *many, "--every-microbatch")
    assert code == 0, err
    every = json.loads(out)
    assert (line["line_through"], every["line_through"]) == ([[2, 2], [2, 4]], [])
    assert line["step_seconds"] == every["step_seconds"] and line["memory"] == every["memory"]
    code, out, err = run_cli(capsys, *many[:-1])
    assert "runs of 2 stages x 2, 2 stages x 4 microbatches: the step of 8 is read off the line" in out
    assert "run 1 of 2: 2 stages, 2 microbatches" in err  # the progress of each simulated run


def test_an_impossible_configuration_is_a_usage_error(capsys):
    code, out, err = run_cli(capsys, *SMALL[:-2], "--global-batch", "3", "--virtual", "2")
    assert code == 2 and "cannot run" in err
    code, out, err = run_cli(capsys, "--layers", "2")
    assert code == 2 and "--preset" in err


def test_a_preset_changed_by_options():
    args = cli.parser().parse_args(["predict", "--preset", "megatron-175b-seqsel", "--global-batch", "16",
                                    "--no-sequence-parallel"])
    cfg = config_from_args(args)
    assert cfg.parallel.global_batch == 16 and not cfg.parallel.sequence_parallel
    assert cfg.model == megatron("175B", "seqsel").model and cfg.recompute == "selective"
    # the physics flags: what overlaps, the gradients' dtype, dropout
    args = cli.parser().parse_args(["predict", "--preset", "megatron-175b-seqsel", "--no-tp-overlap",
                                    "--no-dp-overlap", "--grad-dtype", "half", "--dropout", "0",
                                    "--no-fsdp-overlap"])
    cfg = config_from_args(args)
    assert (cfg.tp_overlap, cfg.dp_overlap, cfg.grad_dtype, cfg.dropout, cfg.fsdp_overlap) == (
        False, False, "half", 0.0, False)
    assert config_from_args(cli.parser().parse_args(["predict", "--preset", "narayanan-1.7b"])).dp_overlap


def test_help_shows_the_flags_and_what_a_prediction_costs(capsys):
    with pytest.raises(SystemExit):
        cli.main(["predict", "--help"]) if hasattr(cli, "main") else cli.parser().parse_args(["predict", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--tp-overlap", "--no-tp-overlap", "--dp-overlap", "--no-dp-overlap", "--grad-dtype",
                 "--fsdp-overlap", "--no-fsdp-overlap", "--dropout"):
        assert flag in out
    assert "What a prediction costs to compute" in out and "bench/SCALE.md measures each preset" in out


def test_coarse_events_keep_the_gaps_a_chart_can_show():
    cfg = megatron("175B", "seqsel").but(layers=16, pipeline=4, virtual=1, global_batch=4)
    p = predict(cfg)
    events = coarse_events(p.result.events, p.makespan, columns=200)
    assert len(events) < len(p.result.events) / 1.5
    for r in range(4):
        busy = sum(e.ticks for e in p.result.events_of(r, "compute"))
        merged = [e for e in events if e["rank"] == r and e["stream"] == "compute"]
        gaps = len(p.result.events_of(r, "compute")) - len(merged)
        assert busy <= sum(e["end"] - e["start"] for e in merged) <= busy + gaps * (p.makespan // 200)
        assert {e["label"] for e in merged} == {e.label for e in p.result.events_of(r, "compute")}


def test_the_learners_f_and_g_run_in_the_step_when_written():
    cfg = megatron("175B", "full").but(layers=16, pipeline=2, virtual=1, global_batch=2)
    ops, notes = learner_ops(cfg, folder=REPO / "solutions")
    assert ops is not None and "CopyToTPGroup" in notes[0]
    stub_ops, stub_notes = learner_ops(cfg, folder=REPO / "puzzles")
    assert stub_ops is None and "not written yet" in stub_notes[0]
    theirs, ours = predict(cfg, ops=ops, answer_notes=notes), predict(cfg)
    assert theirs.answer_notes == notes
    # puzzle 11's g copies the partial sum before all-reducing it: a little more time, the same memory
    assert ours.makespan < theirs.makespan < 1.05 * ours.makespan
    assert [m["peak"] for m in theirs.memory] == [m["peak"] for m in ours.memory]


WRONG_G = textwrap.dedent('''
    import torch

    class CopyToTPGroup(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, dist, group):
            ctx.dist, ctx.group = dist, group
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad, None, None          # the all-reduce forgotten

    class ReduceFromTPGroup(torch.autograd.Function):
        @staticmethod
        def forward(ctx, partial, dist, group):
            out = partial.clone()
            dist.all_reduce(out, group=group)
            return out

        @staticmethod
        def backward(ctx, grad):
            return grad, None, None
''')


def test_a_wrong_f_leaves_the_reference_in_place(tmp_path):
    (tmp_path / "p11_three_d_parallel.py").write_text(WRONG_G)
    ops, notes = learner_ops(megatron("175B", "full"), folder=tmp_path)
    assert ops is None and "wrong gradient" in notes[0] and "reference" in notes[0]


SEQUENCE_PAIR = textwrap.dedent('''
    import torch

    def _pieces(t, n):   # [b, s, d] -> [n·b, s/n, d], rank i's tokens in block i
        b, s, d = t.shape
        return t.reshape(b, n, s // n, d).transpose(0, 1).reshape(n * b, s // n, d)

    def _joined(t, n):   # the inverse
        nb, c, d = t.shape
        return t.view(n, nb // n, c, d).transpose(0, 1).reshape(nb // n, n * c, d)

    class GatherFromSequenceParallel(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, dist):
            ctx.dist = dist
            n = dist.get_world_size()
            out = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
            dist.all_gather_into_tensor(out, x.contiguous())
            return _joined(out, n)

        @staticmethod
        def backward(ctx, grad):
            n = ctx.dist.get_world_size()
            out = torch.empty((grad.shape[0], grad.shape[1] // n, grad.shape[2]), dtype=grad.dtype,
                              device=grad.device)
            ctx.dist.reduce_scatter_tensor(out, _pieces(grad, n))
            return out, None

    class ReduceScatterToSequenceParallel(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, dist):
            ctx.dist = dist
            n = dist.get_world_size()
            out = torch.empty((x.shape[0], x.shape[1] // n, x.shape[2]), dtype=x.dtype, device=x.device)
            dist.reduce_scatter_tensor(out, _pieces(x, n))
            return out

        @staticmethod
        def backward(ctx, grad):
            n = ctx.dist.get_world_size()
            out = torch.empty((n * grad.shape[0], *grad.shape[1:]), dtype=grad.dtype, device=grad.device)
            ctx.dist.all_gather_into_tensor(out, grad.contiguous())
            return _joined(out, n), None
''')


def test_a_learners_sequence_parallel_pair_runs_where_the_default_group_is_the_stage(tmp_path):
    (tmp_path / "p14_sequence_parallel.py").write_text(SEQUENCE_PAIR)
    staged = megatron("175B", "seqsel").but(layers=12, pipeline=1, virtual=1, global_batch=1,
                                            simulate_tensor_ranks="all")
    ops, notes = learner_ops(staged, folder=tmp_path)
    assert ops is not None and "GatherFromSequenceParallel" in notes[0]
    theirs, ours = predict(staged, ops=ops), predict(staged)
    # this pair keeps the gathered input of each product (Megatron gathers it again in backward): more memory
    assert theirs.memory[0]["layer_activations"] > ours.memory[0]["layer_activations"]
    assert theirs.makespan >= ours.makespan * 0.95
    pipelined = megatron("175B", "seqsel")
    ops, notes = learner_ops(pipelined, folder=tmp_path)
    assert ops is None and "--pipeline 1" in notes[0]


def test_puzzle_14s_reference_runs_at_scale_though_it_makes_its_buffers_without_a_device():
    """p14's reference allocates its collectives' buffers with torch.empty(shape, dtype=...): on the CPU, forward
    and backward. At scale they are meta tensors (else a collective copies meta values into real memory)."""
    staged = megatron("175B", "seqsel").but(layers=2, pipeline=1, virtual=1, global_batch=1,
                                            simulate_tensor_ranks="all")
    ops, notes = learner_ops(staged, folder=REPO / "solutions")
    assert ops is not None, notes
    theirs, ours = predict(staged, ops=ops), predict(staged)
    # p14's reference keeps each product's gathered input (Megatron gathers it again in backward)
    assert theirs.memory[0]["layer_activations"] > ours.memory[0]["layer_activations"]


def test_the_notebooks_at_scale_section_runs_the_learners_answers_or_says_whose_ran():
    from grader.frontends.at_scale import run_at_scale, sequence_parallel_config, three_d_config

    three_d, sp = three_d_config(), sequence_parallel_config()
    assert (three_d.model.hidden, three_d.model.layers, three_d.parallel.gpus) == (12288, 96, 64)  # GPT-3 175B
    assert sp.parallel.sequence_parallel and sp.simulated_ranks == 8 and sp.model.hidden == 12288
    runs = run_at_scale(folder=REPO / "solutions")
    assert [("CopyToTPGroup" in p.answer_notes[0], "GatherFromSequenceParallel" in p.answer_notes[0])
            for _, p in runs] == [(True, False), (False, True)]
    assert "your puzzle 11's" in runs[0][1].answer_notes[0] and "your puzzle 14's" in runs[1][1].answer_notes[0]
    # no recomputation at GPT-3's size: the first stage's memory is over the A100's 80 GB
    assert runs[0][1].memory[0]["peak"] > 80 * 2**30 > runs[1][1].memory[0]["peak"]


def test_a_llama_report_names_no_gpt_formula_and_its_published_run_is_named(capsys):
    """The Llama step's report prints no Korthikanti et al. formula (it counts Megatron's GPT layer); a preset run
    unchanged names its published figure and source."""
    code, out, err = run_cli(capsys, "--preset", "torchtitan-llama3-8b", "--layers", "2")
    assert code == 0, err
    assert "Korthikanti" not in out and "FSDP over all 8" in out and "tokens/s per GPU" in out
    assert "published" not in out.split("MFU")[0]  # a changed preset is no published run
    code, out, err = run_cli(capsys, "--preset", "megatron-22b-seqsel")
    assert code == 0, err
    assert "Korthikanti et al. 2022 (arXiv 2205.05198v1), Table 5" in out
    assert "Figure 1, the same formula evaluated" in out


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class _Terminal(__import__("io").StringIO):
    def isatty(self):
        return True


def test_at_a_terminal_predict_shows_what_it_simulates_the_work_done_and_the_time_left():
    """predict's progress callback (runner.py: run, runs, what, done, total) drawn by progress.py, as batch and
    mutate draw theirs: the run lines stay, the progress line under them is redrawn and erased at the end."""
    from grader.frontends.predict import RunProgress
    from grader.frontends.progress import ERASE

    out, clock = _Terminal(), _Clock()
    with RunProgress("GPT 175B on 64 GPUs", stream=out, enabled=True, clock=clock) as progress:
        progress(1, 2, "8 stages, 16 microbatches", 0, 320)
        clock.now += 30
        progress(2, 2, "8 stages, 24 microbatches", 128, 320)
        assert progress.bar.line().startswith(
            "GPT 175B on 64 GPUs  128/320 stage-microbatches simulated  [")
        assert progress.bar.line().endswith("40%  0:30 so far, about 0:45 left")
    drawn = out.getvalue()
    assert "  run 1 of 2: 8 stages, 16 microbatches\n" in drawn and "  run 2 of 2: 8 stages, 24 microbatches\n" in drawn
    assert drawn.endswith("\r" + ERASE)  # the line erased: the run lines and the report are what stays


def test_off_a_terminal_or_with_json_predict_writes_the_run_lines_alone(capsys):
    """capsys's streams are no terminals: the run lines as before, no carriage return, no bar; --json draws no
    bar even at a terminal (enabled=False)."""
    from grader.frontends.predict import RunProgress

    many = [*SMALL[:-2], "--global-batch", "8"]
    for extra in ((), ("--json",)):
        code, out, err = run_cli(capsys, *many, *extra)
        assert code == 0, err
        assert "run 1 of 2: 2 stages, 2 microbatches" in err and "\r" not in err and "[" not in err
    out = _Terminal()
    with RunProgress("x", stream=out, enabled=False) as progress:
        progress(1, 1, "1 microbatch", 0, 1)
    assert out.getvalue() == "  run 1 of 1: 1 microbatch\n"


def test_the_notebooks_prediction_cell_says_how_long_it_takes_before_it_runs(capsys, monkeypatch):
    """Issue 30: the cell takes seconds, or says before it runs how long it takes (its markdown and its first
    line): 17 s of one CPU core when it was set (run_at_scale on solutions/, at a load average of 8.6)."""
    from grader.frontends import at_scale as module
    from grader.frontends.notebooks.file import AT_SCALE_TEXT

    assert "The cell takes about 20 seconds" in " ".join(AT_SCALE_TEXT.split())
    monkeypatch.setattr(module, "run_at_scale", lambda namespace, folder: [])
    module.at_scale({}, plots=False)
    assert capsys.readouterr().out.startswith("Simulating GPT-3 175B's step twice on meta tensors (3-D, then "
                                              "sequence parallelism): about 20 seconds ...")
