"""p20 the hang: ranks that take different branches hang at a collective; the flight recorder says where.

    spec.py       SPEC: the harness (two runs of four steps, each step inside record_function), the checks
    layout.py     the sizes, the data (which rank has no real row at which step, from the seed), the serial run,
                  and the ways of getting a step wrong, replayed (normalizations x selections of rows)
    diagnoses.py  the likely cause of a wrong step, a wrong logged loss, too many bytes

Uses the simulator's collective timeout and flight recorder (puzzles/simulator/watchdog.py, flight_recorder.py).
"""

from .spec import SPEC

__all__ = ["SPEC"]
