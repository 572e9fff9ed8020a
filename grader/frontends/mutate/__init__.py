"""`python -m grader mutate [TARGET] [-p ID]`: mutation testing of the grader itself.

Each mutant is a reference solution with one learner's mistake put into its `# BEGIN SOLUTION` / `# END
SOLUTION` regions; the grader should reject every mutant that is not equivalent to the reference.

    source.py             a solution as the operators see it: AST, regions, edits on the text, the Mutant record
    operators.py          what an operator is, their registry, shared AST helpers, `mutants()`
    ops_communication.py  reduce-op, drop-collective, drop-wait, wrong-peer, swap-statements
    ops_arithmetic.py     drop-division, double-division, off-by-one, drop-guard
    ops_tensors.py        drop-detach, drop-requires-grad, drop-grad-mode, in-place, drop-clone, drop-free,
                          rank-to-zero, wrong-dim, swap-args, reverse-order
    outcome.py            what grading one mutant came to (Outcome, the statuses) and its limits
    runner.py             grading mutants in forked children, with limits; whose fault each ending is
    child.py              the forked child: grade one mutant, report each step through a pipe
    equivalents.py        the reviewed list of equivalent mutants, each with its reason
    session.py            one run: the reference first (it must pass; it sets the time limit), then its mutants
    report.py             the tables, survivors with diffs, --json, the exit status
    command.py            the command line: arguments in, report and exit status out
"""

from . import ops_arithmetic, ops_communication, ops_tensors

OPERATOR_MODULES = (ops_communication, ops_arithmetic, ops_tensors)  # importing them registers their operators
