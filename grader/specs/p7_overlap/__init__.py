"""p7 overlap: data parallel whose gradient all-reduces run asynchronously, hidden behind backward.

    spec.py  SPEC, on p3's step: the exposed communication and the order of the waits

Builds on p3 (p3_data_parallel/spec.py): its sizes, data-parallel step and reference.
"""

from .spec import SPEC

__all__ = ["SPEC"]
