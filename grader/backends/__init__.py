"""Where the learner's code runs. Imports specs/ and core/ (and puzzles/), never a front end.

    learner_code.py  loading a puzzle file as a fresh module; describing its exceptions by the learner's lines
    simulator.py     run a puzzle on the simulator (puzzles/sim.py) -> an Observation -> core/grading.py
    real/            run it on N real processes on torch.distributed (gloo, NCCL) -> the same Observation

Both backends hand core/grading.py the same plain data, so the same checks grade both.
"""
