"""The mutation operators of `python -m grader mutate`: each makes the mutant it should on a small source, touches
only the solution regions, and keeps the rest of the file's text (comments, line numbers) as it was."""

from __future__ import annotations

import ast

import pytest

from grader.frontends.mutate.operators import OPERATORS, mutants
from grader.frontends.mutate.source import Source, solution_regions

TOY = '''"""A made-up answer with one place for each mistake the operators make (parsed, never run)."""

import torch


def helper(a, b):
    return a / b  # outside every solution region: never mutated


def step(dist, x, layers, held):
    # BEGIN SOLUTION
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = x.chunk(world)[rank].clone()
    with torch.no_grad():
        dist.all_reduce(shard)
        shard /= world
    y = shard.detach().requires_grad_()
    if rank > 0:
        dist.send(y, dst=rank - 1)
    work = dist.all_gather_into_tensor(x, y, async_op=True)
    work.wait()
    for i in range(len(layers)):
        y = y + layers[i][0:2].sum() / world
    item = held.popleft()
    del shard
    return torch.cat([y, item])
    # END SOLUTION
'''

# (the reference's line, what the mutant made of it; "" when the line is gone), for each operator, in order
EXPECTED = {
    'drop-division': [
        ('shard /= world', ''),
        ('y = y + layers[i][0:2].sum() / world', 'y = y + layers[i][0:2].sum()'),
    ],
    'double-division': [
        ('shard /= world', 'shard /= world * world'),
        ('y = y + layers[i][0:2].sum() / world', 'y = y + layers[i][0:2].sum() / world / world'),
    ],
    'off-by-one': [
        ('if rank > 0:', 'if rank >= 0:'),
        ('for i in range(len(layers)):', 'for i in range(len(layers) + 1):'),
        ('for i in range(len(layers)):', 'for i in range(len(layers) - 1):'),
        ('y = y + layers[i][0:2].sum() / world', 'y = y + layers[i][1:2].sum() / world'),
        ('y = y + layers[i][0:2].sum() / world', 'y = y + layers[i][-1:2].sum() / world'),
        ('y = y + layers[i][0:2].sum() / world', 'y = y + layers[i][0:3].sum() / world'),
        ('y = y + layers[i][0:2].sum() / world', 'y = y + layers[i][0:1].sum() / world'),
    ],
    'drop-guard': [
        ('if rank > 0:', 'if True:'),
    ],
    'reduce-op': [
        ('dist.all_reduce(shard)', 'dist.all_reduce(shard, op=dist.ReduceOp.AVG)'),
    ],
    'drop-collective': [
        ('dist.all_reduce(shard)', ''),
        ('dist.send(y, dst=rank - 1)', ''),
        ('work = dist.all_gather_into_tensor(x, y, async_op=True)', ''),
    ],
    'drop-wait': [
        ('work.wait()', ''),
    ],
    'wrong-peer': [
        ('dist.send(y, dst=rank - 1)', 'dist.send(y, dst=rank + 1)'),
    ],
    'swap-statements': [
        ('with torch.no_grad():', 'y = shard.detach().requires_grad_()'),
        ('if rank > 0:', 'work = dist.all_gather_into_tensor(x, y, async_op=True)'),
        ('work.wait()', 'for i in range(len(layers)):'),
        ('dist.all_reduce(shard)', 'shard /= world'),
    ],
    'drop-detach': [
        ('y = shard.detach().requires_grad_()', 'y = shard.requires_grad_()'),
    ],
    'drop-requires-grad': [
        ('y = shard.detach().requires_grad_()', 'y = shard.detach()'),
    ],
    'drop-grad-mode': [
        ('with torch.no_grad():', ''),
    ],
    'in-place': [
        ('shard /= world', 'shard = shard / world'),
        ('y = y + layers[i][0:2].sum() / world', 'y += layers[i][0:2].sum() / world'),
    ],
    'drop-clone': [
        ('shard = x.chunk(world)[rank].clone()', 'shard = x.chunk(world)[rank]'),
    ],
    'drop-free': [
        ('del shard', ''),
    ],
    'rank-to-zero': [
        ('shard = x.chunk(world)[rank].clone()', 'shard = x.chunk(world)[0].clone()'),
    ],
    'wrong-dim': [
        ('shard = x.chunk(world)[rank].clone()', 'shard = x.chunk(world, dim=1)[rank].clone()'),
        ('return torch.cat([y, item])', 'return torch.cat([y, item], dim=1)'),
    ],
    'swap-args': [
        ('work = dist.all_gather_into_tensor(x, y, async_op=True)', 'work = dist.all_gather_into_tensor(y, x, async_op=True)'),
    ],
    'reverse-order': [
        ('for i in range(len(layers)):', 'for i in reversed(range(len(layers))):'),
        ('item = held.popleft()', 'item = held.pop()'),
    ],
}


@pytest.mark.parametrize("name", list(OPERATORS))
def test_each_operator_makes_the_expected_mutants(name):
    made = [(m.line, m.mutant) for m in mutants(Source(TOY, "toy.py"), "px", [name])]
    assert made == EXPECTED[name]


def test_every_operator_is_tested_and_says_which_mistake_it_makes():
    assert set(EXPECTED) == set(OPERATORS)
    assert all(len(op.mistake) > 20 for op in OPERATORS.values())


def test_only_the_solution_regions_are_mutated_and_the_rest_keeps_its_text():
    source = Source(TOY, "toy.py")
    (first, last), = source.regions
    original = TOY.splitlines()
    for m in mutants(source, "px"):
        ast.parse(m.source)  # every mutant is Python
        lines = m.source.splitlines()
        assert lines[:first - 1] == original[:first - 1], m.description  # the helper's division stays
        tail = len(original) - last
        assert lines[len(lines) - tail:] == original[last:], m.description
        assert m.diff.startswith("--- toy.py") and "+++ toy.py (mutant)" in m.diff


def test_two_operators_that_make_the_same_text_make_one_mutant():
    texts = [m.source for m in mutants(Source(TOY, "toy.py"), "px")]
    assert len(texts) == len(set(texts))


def test_a_dropped_with_moves_its_body_out_and_keeps_the_comments():
    source = Source(TOY.replace("dist.all_reduce(shard)", "dist.all_reduce(shard)  # sum"), "toy.py")
    [m] = mutants(source, "px", ["drop-grad-mode"])
    assert "\n    dist.all_reduce(shard)  # sum\n    shard /= world\n" in m.source
    assert m.lineno == TOY.splitlines().index("    with torch.no_grad():") + 1


def test_deleting_the_only_statement_of_a_block_leaves_pass():
    [m] = mutants(Source(TOY, "toy.py"), "px", ["wrong-peer"])
    source = Source(m.source.replace("dist.send(y, dst=rank + 1)", "dist.send(y, dst=rank - 1)"), "toy.py")
    dropped = [x for x in mutants(source, "px", ["drop-collective"]) if x.line.startswith("dist.send")]
    assert "    if rank > 0:\n        pass\n" in dropped[0].source


def test_the_key_tells_apart_two_lines_with_the_same_text():
    text = TOY.replace("    work.wait()\n", "    work.wait()\n    print(work)\n    work.wait()\n")
    keys = [m.key for m in mutants(Source(text, "toy.py"), "px", ["drop-wait"])]
    assert [k["occurrence"] for k in keys] == [1, 2] and {k["line"] for k in keys} == {"work.wait()"}


def test_regions_are_read_from_the_markers():
    assert solution_regions("a\n# BEGIN SOLUTION\nb\nc\n# END SOLUTION\nd\n    # BEGIN SOLUTION\ne\n    # END SOLUTION\n") \
        == [(3, 4), (8, 8)]
    assert mutants(Source("def f(a, b):\n    return a / b\n", "x.py"), "px") == []  # no region, no mutant
