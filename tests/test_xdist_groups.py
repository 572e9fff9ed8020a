"""`pytest tests` keeps a file marked `xdist_group` on one worker (tests/xdist_groups.py), so that its costly
module-scoped fixture (a batch run, a virtual environment, a gloo job) is made once per suite."""

import subprocess
import sys
import textwrap

import pytest
from xdist_groups import file_group, work_unit

TESTS = __import__("pathlib").Path(__file__).resolve().parent


def test_the_marked_files_are_read_for_their_group():
    assert file_group(str(TESTS / "test_batch_sandbox.py")) == "batch_sandbox"
    assert file_group(str(TESTS / "test_real_backend.py")) == "gloo-parity"  # (a list of marks)
    assert file_group(str(TESTS / "test_cli.py")) is None
    assert file_group(str(TESTS / "no_such_file.py")) is None


def test_a_marked_files_tests_are_one_work_unit_and_the_rest_one_each():
    def scope(nodeid):
        return work_unit(nodeid, TESTS.parent)

    assert scope("tests/test_batch_sandbox.py::test_nothing_outlives_the_batch") == "batch_sandbox"
    assert scope("tests/test_batch_sandbox.py::test_patching[tamper_cost-p3]") == "batch_sandbox"
    assert scope("tests/test_cli.py::test_help") == "tests/test_cli.py::test_help"
    assert scope("tests/test_cli.py::test_x[a@b]") == "tests/test_cli.py::test_x[a@b]"  # (an @ in a parameter)
    assert scope("tests/test_cli.py::test_x@named") == "named"  # xdist's own suffix, where pytest keeps it


def test_under_xdist_a_marked_files_module_fixture_is_made_once(tmp_path):
    pytest.importorskip("xdist")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text(textwrap.dedent("""
        import sys
        sys.path.insert(0, %r)
        from xdist_groups import make_scheduler

        def pytest_xdist_make_scheduler(config, log):
            return make_scheduler(config, log)
    """ % str(TESTS)))
    (tmp_path / "tests" / "test_grouped.py").write_text(textwrap.dedent("""
        import os, pytest
        pytestmark = pytest.mark.xdist_group("made_once")

        @pytest.fixture(scope="module")
        def made():
            with open("made.log", "a") as f:
                f.write(f"{os.getpid()}\\n")

        @pytest.mark.parametrize("i", range(8))
        def test_uses_it(made, i):
            pass
    """))
    (tmp_path / "tests" / "test_other.py").write_text(
        "import pytest\n@pytest.mark.parametrize('i', range(8))\ndef test_other(i):\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadgroup"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    made = (tmp_path / "made.log").read_text().split()
    assert len(made) == 1, f"the module fixture was made {len(made)} times (in processes {made}): {proc.stdout}"
