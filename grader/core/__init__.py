"""What a verdict is made of. Imports nothing of the grader's other layers (only puzzles/).

    spec.py      PuzzleSpec (a puzzle as data plus a few functions) and Observation (what a run produced)
    result.py    Budget, Check, PuzzleResult: the structured result every rendering reads
    compare.py   tensors against the reference (where they differ, by how much), budgets against measurements
    rules.py     rules several puzzles state, measured once: compute (FLOPs per rank), bytes sent, a pipeline
                 stage's work sequence, memory excess named by its size; the bookkeeping allowance
    schedule.py  a rank's schedule read off its messages and ops: the products between a message's arrival and the
                 messages that needed it, the least time work takes at the peak rate
    grading.py   Observation -> the spec's checks against its reference -> PuzzleResult
    report.py    renderings of a result: console, JSON, notebook HTML, the pytest message
    probe.py     measurements a rank program takes while the learner's code runs (bytes alive now)
"""
