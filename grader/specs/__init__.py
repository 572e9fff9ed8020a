"""One module per puzzle, each defining `SPEC`; adding a puzzle is adding a module here and a solution."""

from __future__ import annotations

import importlib
import re
import pkgutil

from ..spec import PuzzleSpec


def _discover() -> dict[str, PuzzleSpec]:
    specs = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("p") and "_" in info.name:
            specs.append(importlib.import_module(f"{__name__}.{info.name}").SPEC)
    specs.sort(key=lambda s: (int(re.match(r"p(\d+)", s.id).group(1)), s.id))
    return {s.id: s for s in specs}


SPECS = _discover()
