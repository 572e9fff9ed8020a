"""What people use. May import every layer below (backends/, specs/, core/); nothing imports a front end.

    cli.py            `python -m grader [check|build|batch|gradescope|release]`
    targets.py        what to grade (a folder like puzzles/, a notebook) and on which backend
    notebook.py       the notebook's check cell (public as grader.notebook.check)
    notebook_file.py  the notebook as a file: made from solutions/, its puzzle cells read back for grading
    stubs.py          the `# BEGIN SOLUTION` / `# END SOLUTION` convention: solutions -> stubs
    build.py          `build`: regenerate the stubs in puzzles/ and puzzles.ipynb; `build --check`
    batch.py          `batch`: grade a class, each submission in its own process
    scoring.py        points: weights per puzzle and check (a TOML/JSON file), all or nothing by default
    class_report.py   batch's reports: CSV, JSON, per-student feedback with plots, Gradescope's format
    gradescope.py     Gradescope's results.json; what run_autograder runs inside its container
    gradescope_bundle.py  `gradescope OUT`: the autograder bundle (setup.sh, run_autograder, the package)
    release.py        `release OUT`: the student copy (stubs, notebook, self-grading tests; no solutions)
    launch.py         torchrun's entry point (public as grader.launch)
    plots/            memory timelines and schedules (matplotlib, no pyplot)

Instructor tools to come live here too, each in its own module: mutation testing, the grading sandbox.
"""
