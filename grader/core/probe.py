"""Measurements a rank program takes while the learner's code runs (say, the bytes a rank holds between its
forward and its backward). On the simulator they read the rank's ledger; on real torch.distributed processes,
the tracker that the real-backend launcher installs."""

from __future__ import annotations

from puzzles import sim

_process_tracker = None  # a callable returning the bytes alive in this process, set by the real-backend launcher


def install_process_tracker(current_bytes) -> None:
    global _process_tracker
    _process_tracker = current_bytes


def memory_now() -> int:
    """Bytes alive on the calling rank right now."""
    ledger = sim.current_ledger()
    if ledger is not None:
        return ledger.current
    if _process_tracker is not None:
        return _process_tracker()
    raise RuntimeError("memory_now() needs a simulated rank or a tracked process")
