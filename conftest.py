"""pytest options for self-grading: `pytest --target solutions` (or a folder, or a notebook) and `--seed N`.

They live at the top of the checkout, not in tests/, so that pytest knows them before it collects: plain `pytest`
collects only tests/test_puzzles.py (pyproject.toml's testpaths), and in `pytest --target solutions` pytest first
takes `solutions` for a path to collect, and loads the conftest.py files above that path only.
"""

import secrets


def pytest_addoption(parser):
    group = parser.getgroup("training puzzles")
    group.addoption("--target", default="puzzles",
                    help="what tests/test_puzzles.py grades: 'puzzles' (default), 'solutions', a folder laid out like "
                         "puzzles/, or a notebook")
    group.addoption("--seed", type=int, default=None, help="the grading seed (default: a fresh one, printed)")


def pytest_configure(config):
    seed = config.getoption("--seed")
    worker = getattr(config, "workerinput", None)  # a pytest-xdist worker: the controller chose the seed
    if worker is not None and "grading_seed" in worker:
        config.grading_seed = worker["grading_seed"]
    else:
        config.grading_seed = seed if seed is not None else secrets.randbelow(1_000_000)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_SameSeedOnEveryWorker(), "training-puzzles-seed")


class _SameSeedOnEveryWorker:
    """With pytest-xdist (`pytest tests` runs on every core), each worker grades with the seed the controller
    printed in its header. A class registered only when xdist is there: its hook is xdist's."""

    @staticmethod
    def pytest_configure_node(node):
        node.workerinput["grading_seed"] = node.config.grading_seed


def pytest_report_header(config):
    return (f"training puzzles: grading target {config.getoption('--target')!r}, "
            f"seed {config.grading_seed} (reproduce with --seed {config.grading_seed})")
