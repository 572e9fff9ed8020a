"""The oldest torch the puzzles run on, and the check that says so plainly where pip cannot.

pip holds a repository install to pyproject.toml's `torch>=` requirement; the standalone notebook has no pip and
runs on whatever torch its kernel has (Colab's, a cluster's). Its first cell runs `torch_problem` before it unpacks
anything (standalone.py writes this function's source into the cell), so that too old a torch, or none, is named
with what to do, instead of failing three cells later in a way that reads like the learner's mistake.

MIN_TORCH mirrors pyproject.toml's requirement (tests/test_torch_range.py holds the two equal). CI grades every
reference and naive answer, the notebook's check cells and the standalone notebook on that release as well as on
the pinned one (.ci/run, `pytest -m learner`); README, "Which torch", says what was tried and why this release.
"""

MIN_TORCH = "2.2"


def torch_problem(minimum):
    """None when this Python's torch is `minimum` or newer; else what is wrong and what to do, in words.

    Self-contained (its imports inside, no annotations newer Pythons need), since its source runs in the
    notebook's first cell before the package is there."""
    import re

    def release(version):
        return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])

    install = f'pip install "torch>={minimum}"'
    remedy = (f"In Colab: run `!{install}` in a new cell, then Runtime > Restart session, and run this cell "
              f"again. Elsewhere: `{install}` in this kernel's environment, then restart the kernel.")
    try:
        import torch
    except Exception as exc:  # not installed, or installed but broken (a missing library, a wrong build)
        return f"These puzzles need torch {minimum} or newer, and torch could not be imported ({exc!r}). {remedy}"
    version = str(getattr(torch, "__version__", "unknown"))
    if release(version) < release(minimum):
        return f"These puzzles need torch {minimum} or newer; this kernel has torch {version}. {remedy}"
    return None
