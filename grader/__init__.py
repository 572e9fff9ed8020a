"""The grader: runs a learner's answer, compares it with a serial reference, and says what is wrong.

Four layers; each imports only the layers below it (tests/test_layout.py holds this, and that there is no
import cycle):

    frontends/   what people use: the CLI (`python -m grader`), the notebook's check cell, plots, `build`
                 (stubs and notebook from solutions/), `batch` (a class), torchrun's launcher
    backends/    where the learner's code runs: the simulator (simulator.py), or real torch.distributed
                 processes (real/); both load the learner's file the same way (learner_code.py)
    specs/       one module per puzzle: inputs, serial reference, what each rank runs, budgets, checks
    core/        what a verdict is made of: PuzzleSpec and Observation, Check and PuzzleResult, comparing
                 tensors, grading an observation, rendering a result (console, JSON, HTML, pytest)

A verdict flows: learner code -> `dist` -> the simulated world (puzzles/sim.py) -> ledger and clock ->
Observation (plain data) -> the spec's checks -> PuzzleResult -> a report (console, JSON, notebook, pytest).

Two names at this level are public because people type them: `grader.notebook.check` (every notebook's check
cell) and `grader.launch` (`torchrun ... -m grader.launch`).
"""
