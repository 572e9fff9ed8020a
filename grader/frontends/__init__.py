"""What people use. May import every layer below (backends/, specs/, predictor/, core/); nothing imports a front end.

    cli.py            `python -m grader [check|build|batch|mutate|gradescope|release|predict]`
    targets.py        what to grade (a folder like puzzles/, one puzzle file, a notebook) and on which backend
    guards.py         what a learner's code must not do to the grader (sys.exit, os._exit), syntax errors, hints
    notebook.py       the notebook's check cell (public as grader.notebook.check)
    notebooks/        the notebooks as files: made from solutions/, and read back for grading
    stubs.py          the `# BEGIN SOLUTION` / `# END SOLUTION` convention: solutions -> stubs
    build.py          `build`: regenerate the stubs and the notebooks, never over a learner's edits; `--check`
    release.py        `release OUT`: the student copy (stubs, notebooks, self-grading tests; no solutions)
    shipping.py       what ships to learners (release, Gradescope bundle, standalone notebook) and what stays here
    handed_in.py      where the work is in what a learner hands in (batch and Gradescope alike)
    batch/            `batch`: grading a class for credit, each puzzle in a jail of its own
    reports/          what `batch` writes: points, CSV, JSON, feedback files, Gradescope's results and bundle
    mutate/           `mutate`: mutation testing of the grader (mutants of solutions/, graded in children); the
                      instructor's only: it never ships (shipping.py)
    launch.py         torchrun's entry point (public as grader.launch)
    predict.py        `predict`: a training step at a published size (Megatron-LM's GPT, torchtitan's Llama) on
                      meta tensors, on a cluster of real GPUs: the command line of grader/predictor/
    at_scale.py       the notebook's section at scale: the learner's p11 and p14 operators in GPT-3 175B's step
    plots/            memory timelines and schedules (matplotlib, no pyplot)
    timeline.py       a run's timeline as Chrome trace-event JSON (--trace) and as a text grid (--schedule)
    progress.py       the progress line with the time left that batch, mutate and predict draw at a terminal
"""
