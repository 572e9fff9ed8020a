"""The notebook's check cell: `from grader.notebook import check; check("p3", globals())` grades the functions
the puzzle's cell defined, on the simulator, and shows the result with its plots. (grader/notebook.py is the
public name; the notebook file itself is made and read in notebook_file.py.)"""

from __future__ import annotations

import types

from ..backends import simulator
from ..core import report
from ..core.grading import fresh_seed
from ..specs import SPECS


def check(puzzle_id: str, namespace: dict, seed: int | None = None, plots: bool = True):
    """The notebook's check cell: grade the functions the puzzle's cell defined, and show the result. Each
    simulated rank gets its own copy of the notebook's globals, the closest a notebook comes to each real process
    importing its own module (learner_code.namespace_copy_for_rank says what is copied)."""
    spec = SPECS[puzzle_id]
    module = types.ModuleType(f"notebook_{puzzle_id}")
    module.__dict__.update({k: v for k, v in namespace.items() if not k.startswith("__")})
    seed = fresh_seed() if seed is None else seed
    with spec.run_context():
        result = simulator.grade_module(spec, module, seed)
    _display(result, seed, plots)
    return result


def _display(result, seed: int, plots: bool) -> None:
    try:
        from IPython.display import HTML, display
    except ImportError:  # not in a notebook: print instead
        print(report.pytest_message(result, seed))
        return
    display(HTML(report.to_html(result, seed)))
    if plots and result.figures and result.status in ("pass", "fail"):
        try:
            from . import plots as plots_mod

            for fig in (plots_mod.memory_figure(result), plots_mod.schedule_figure(result)):
                display(fig)
                import matplotlib.pyplot as plt

                plt.close(fig)
        except ImportError:
            pass
