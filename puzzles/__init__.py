"""The puzzles: what a learner opens.

    p1_checkpointing.py ... p8_zero.py   the eight puzzles: a story, then the functions you write
    model.py                            the tiny model every puzzle shares (blocks, loss, init)
    sim.py                              the simulated GPUs: `sim.run(fn, world_size)`, and the map of the simulator
    simulator/                          the simulator's insides (read simulator/collectives.py to see what each
                                        collective does; the rest you need not open)

Your code receives `dist`, which mirrors torch.distributed. A call travels: your code -> `dist` -> the simulated
world, which matches it with the other ranks' calls and moves the data -> each rank's memory ledger and clock
record what happened -> the grader (grader/) compares the result with a serial reference and reports.
The puzzle files are generated from solutions/ by `python -m grader build`; edit them freely, `build` leaves
edited files alone.
"""
