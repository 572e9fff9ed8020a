"""What people use. May import every layer below (backends/, specs/, core/); nothing imports a front end.

    cli.py            `python -m grader [check|build|batch]`
    targets.py        what to grade (a folder like puzzles/, a notebook) and on which backend
    notebook.py       the notebook's check cell (public as grader.notebook.check)
    notebook_file.py  the notebook as a file: made from solutions/, its puzzle cells read back for grading
    stubs.py          the `# BEGIN SOLUTION` / `# END SOLUTION` convention: solutions -> stubs
    build.py          `build`: regenerate the stubs in puzzles/ and puzzles.ipynb; `build --check`
    batch.py          `batch`: grade a class, each submission in its own process
    launch.py         torchrun's entry point (public as grader.launch)
    plots/            memory timelines and schedules (matplotlib, no pyplot)
    mutate/           `mutate`: mutation testing of the grader (mutants of solutions/, graded in children)

Instructor tools to come live here too, each in its own module: mutation testing, the grading sandbox, a
student release, Gradescope.
"""
