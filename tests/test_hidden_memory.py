"""Memory the ledger does not see (issue 19): every tensor whose bytes are not a plain storage of its own is either
charged in full or refused with HiddenMemoryError, on the simulator and on real processes alike.

- Charged: sparse tensors in every layout (their indices and values), quantized, meta and nested (strided) ones,
  and storages that change size where no op shows it (`t.resize_`, `untyped_storage().resize_`, a storage made
  directly and viewed with `set_`), whenever an op shows them and again when the rank returns.
- Refused: a tensor subclass with a `__torch_dispatch__` of its own (the jagged nested tensor is one), mkldnn.
- The cheats of tests/wrong/ that keep p2's checkpoints or p8's Adam moments in such forms fail their budgets on
  both backends (held by test_wrong_answers.py on the simulator, here on gloo).
The rank programs are in hidden_memory_helpers.py. Budget: about 20 s on 2 cores (two or three gloo groups).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hidden_memory_helpers import CHARGED, MAKERS, REFUSED, keep

from grader.backends.learner_code import load_module
from grader.specs import SPECS
from puzzles import sim

WRONG = Path(__file__).parent / "wrong"
CHEATS = ["p2_checkpoints_as_sparse", "p2_checkpoints_in_resized_buffers", "p8_moments_as_sparse",
          "p8_moments_in_grown_storages"]
gloo = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                          reason="torch.distributed with gloo is not available")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's "beta"/"prototype" notes on sparse and nested tensors
        yield


@pytest.mark.parametrize("kind", list(CHARGED))
def test_every_kind_of_tensor_is_charged_in_full_on_the_simulator(kind):
    result = sim.run(keep, 1, args=(kind,))
    assert result.ledgers[0].current >= CHARGED[kind], (kind, result.ledgers[0].current, CHARGED[kind])
    assert result.ledgers[0].audit() == []


@pytest.mark.parametrize("kind", REFUSED)
def test_a_tensor_whose_bytes_no_storage_shows_is_refused_on_the_simulator(kind):
    with pytest.raises(sim.HiddenMemoryError) as info:
        sim.run(keep, 1, args=(kind,))
    message = str(info.value)
    assert "the memory ledger cannot see its bytes" in message and "hidden_memory_helpers.py:" in message, message


def test_a_storage_that_shrinks_in_place_leaves_the_ledger():
    """The other direction, which an honest answer may take (FSDP frees a gathered weight with
    `untyped_storage().resize_(0)`): the bytes leave the ledger when the storage shrinks."""
    def rank(dist):
        w = torch.randn(64, 64, dtype=torch.float64)
        w.untyped_storage().resize_(0)
        return torch.zeros(1, dtype=torch.float64).add_(1)  # an op after it, before the rank returns

    result = sim.run(rank, 1)
    assert result.ledgers[0].peak == 64 * 64 * 8 + 8 and result.ledgers[0].current == 8, result.ledgers[0]
    assert result.ledgers[0].audit() == []


@gloo
def test_every_kind_is_charged_or_refused_on_real_processes_too():
    from grader.backends import real

    tasks = [real.FunctionTask(keep, (kind,)) for kind in [*CHARGED, *REFUSED]]
    outcomes = real.run_tasks(tasks, 1, timeout=60.0)
    for kind, outcome in zip([*CHARGED, *REFUSED], outcomes):
        if kind in CHARGED:
            assert outcome.ok, (kind, outcome.error)
            current = outcome.payloads[0]["ledger"]["current"]
            assert current >= CHARGED[kind], (kind, current, CHARGED[kind])
        else:
            assert outcome.status == "error" and "HiddenMemoryError" in outcome.error, (kind, outcome.error)
            assert "the memory ledger cannot see its bytes" in outcome.error, outcome.error


@gloo
def test_the_cheats_fail_their_budgets_on_real_processes_too():
    from grader.backends import real

    files = [(SPECS[name.split("_")[0]], WRONG / f"{name}.py") for name in CHEATS]
    for (spec, path), result in zip(files, real.grade_files(files, 7)):
        answer = load_module(path)
        failed = {c.name for c in result.checks if not c.passed and not c.simulator_only}
        assert result.status == "fail" and failed == set(answer.EXPECTED_FAILURES), (path.name, result.status,
                                                                                       result.error, failed)

