"""Fixtures shared by the tests, and how `pytest tests` runs. (The self-grading options, --target and --seed, are
in the checkout's top-level conftest.py, so that plain `pytest` knows them.)

`pytest tests`, the whole suite, runs on every core when pytest-xdist is installed (the dev extra has it): as
`-n auto --dist loadgroup`, unless -n or --dist is given (`-n 0` runs in one process). A file whose tests share an
expensive module-scoped fixture marks itself `pytest.mark.xdist_group(...)`, so that one worker computes it once.
Naming files or tests (`pytest tests/test_cli.py`) runs in one process, as before.

Tests marked `slow` are the whole of an inherently long check whose fast representative runs by default (the
mutation kill rate of every puzzle, gloo parity of every puzzle, ...): `pytest tests` leaves them out, `pytest tests
-m slow` runs them (CI runs both: .ci/run), and any `-m` expression decides for itself.
"""

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _the_whole_suite(config) -> bool:
    return any(Path(a.split("::")[0]).resolve() == TESTS for a in config.args)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """`pytest tests` on every core (before pytest-xdist reads its options)."""
    if not config.pluginmanager.hasplugin("xdist") or getattr(config, "workerinput", None) is not None:
        return
    if config.option.numprocesses is None and config.option.dist == "no" and _the_whole_suite(config) and not (
            config.option.collectonly or config.getoption("usepdb", False)):
        config.option.numprocesses = "auto"
        config.option.dist = "loadgroup"


def pytest_xdist_make_scheduler(config, log):
    """With --dist loadgroup (what `pytest tests` sets), a file marked `xdist_group` runs on one worker whatever
    pytest's version (tests/xdist_groups.py says why xdist's own way no longer does)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist_groups import make_scheduler

    return make_scheduler(config, log)


def pytest_collection_modifyitems(config, items):
    """Without -m, the slow tests are left out (deselected, and counted as such in the summary). Every test
    collected, slow ones included, stays readable as `config.collected_items` (test_torch_range.py reads off it
    what `-m learner` would select)."""
    config.collected_items = list(items)
    if config.option.markexpr:
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def pytest_collection_finish(session):
    """The imports are done: put what they made out of the garbage collector's reach (grader.core.grading)."""
    from grader.core.grading import settle_imports

    settle_imports()


@pytest.fixture
def grading_seed(request):
    return request.config.grading_seed
