"""The notebooks as files (the check cell that runs inside them is ../notebook.py).

    file.py        puzzles.ipynb and puzzles-standalone.ipynb, made from solutions/ by `build`
    story.py       a puzzle's story (its docstring) as notebook markdown, diagrams in fenced blocks
    standalone.py  the standalone notebook's first cell: the package, zipped, and the lines that unpack it
    torch_check.py the oldest torch the puzzles run on (pyproject.toml's), checked first in that cell
    cells.py       a notebook read back for grading: the learner's code cells, each puzzle as a file of them

solutions/ -> file.py -> the notebooks; a learner's notebook -> cells.py -> files graded like puzzles/.
"""
