"""Fixtures shared by the tests. (The self-grading options, --target and --seed, are in the checkout's top-level
conftest.py, so that plain `pytest` knows them.)"""

import pytest


@pytest.fixture
def grading_seed(request):
    return request.config.grading_seed
