"""What people use. May import every layer below (backends/, specs/, core/); nothing imports a front end.

    cli.py            `python -m grader [check|build|batch]`
    targets.py        what to grade (a folder like puzzles/, one puzzle file, a notebook) and on which backend
    guards.py         what a learner's code must not do to the grader (sys.exit, os._exit), syntax errors, hints
    notebook.py       the notebook's check cell (public as grader.notebook.check)
    notebook_file.py  the notebooks as files, made from solutions/ (puzzles.ipynb, puzzles-standalone.ipynb)
    notebook_cells.py a notebook read back for grading: the learner's cells, each puzzle as a file of them
    story_markdown.py a puzzle's story (its docstring) as notebook markdown
    standalone.py     the standalone notebook's first cell: the package, zipped, and the lines that unpack it
    stubs.py          the `# BEGIN SOLUTION` / `# END SOLUTION` convention: solutions -> stubs
    build.py          `build`: regenerate the stubs and the notebooks, never over a learner's edits; `--check`
    batch.py          `batch`: grade a class; the parent, which decides every verdict (batch_verdict.py)
    zygote.py         batch's worker: torch imported once, a warden and a jail forked per puzzle
    runner.py         the puzzle's own process in the jail: runs one puzzle, writes what it observed
    sandbox.py        the operating system's isolation (namespaces, pivot_root, uids, rlimits); reaper.py,
                      killing what a puzzle started; wire.py, the messages between the parent and a worker
    snapshot.py       a fingerprint of the grader's and simulator's code, to flag tampering (+ tamper_hook.py)
    launch.py         torchrun's entry point (public as grader.launch)
    plots/            memory timelines and schedules (matplotlib, no pyplot)
    mutate/           `mutate`: mutation testing of the grader (mutants of solutions/, graded in children)

Instructor tools to come live here too, each in its own module: mutation testing, the grading sandbox.
"""
