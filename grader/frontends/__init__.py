"""What people use. May import every layer below (backends/, specs/, core/); nothing imports a front end.

    cli.py            `python -m grader [check|build|batch]`
    targets.py        what to grade (a folder like puzzles/, a notebook) and on which backend
    notebook.py       the notebook's check cell (public as grader.notebook.check)
    notebook_file.py  the notebook as a file: made from solutions/, its puzzle cells read back for grading
    stubs.py          the `# BEGIN SOLUTION` / `# END SOLUTION` convention: solutions -> stubs
    build.py          `build`: regenerate the stubs in puzzles/ and puzzles.ipynb; `build --check`
    batch.py          `batch`: grade a class; the parent, which decides every verdict (batch_verdict.py)
    zygote.py         batch's worker: torch imported once, a warden and a jail forked per puzzle
    runner.py         the puzzle's own process in the jail: runs one puzzle, writes what it observed
    sandbox.py        the operating system's isolation (namespaces, pivot_root, uids, rlimits); reaper.py,
                      killing what a puzzle started; wire.py, the messages between the parent and a worker
    snapshot.py       a fingerprint of the grader's and simulator's code, to flag tampering (+ tamper_hook.py)
    launch.py         torchrun's entry point (public as grader.launch)
    plots/            memory timelines and schedules (matplotlib, no pyplot)

Instructor tools to come live here too, each in its own module: mutation testing, the grading sandbox, a
student release, Gradescope.
"""
