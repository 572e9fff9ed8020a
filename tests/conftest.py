"""pytest options for self-grading: `pytest --target solutions` (or a folder) and `--seed N`."""

import secrets

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("training puzzles")
    group.addoption("--target", default="puzzles",
                    help="what tests/test_puzzles.py grades: 'puzzles' (default), 'solutions', or a folder")
    group.addoption("--seed", type=int, default=None, help="the grading seed (default: a fresh one, printed)")


def pytest_configure(config):
    seed = config.getoption("--seed")
    config.grading_seed = seed if seed is not None else secrets.randbelow(1_000_000)


def pytest_report_header(config):
    return (f"training puzzles: grading target {config.getoption('--target')!r}, "
            f"seed {config.grading_seed} (reproduce with --seed {config.grading_seed})")


@pytest.fixture
def grading_seed(request):
    return request.config.grading_seed
