"""The ops allowlist (puzzles/simulator/allowed.py, op_costs.py): an aten op runs on a rank only if op_costs.py has a
cost formula for it, or it is a view or a metadata op; anything else is refused with UncostedOpError naming the op
and the line. Held here: every op torch registers gets a rule, and the ops found charged below their work (issue 29)
are charged as the sums they are. That every op the reference solutions, the naive answers and the alternatives
run is allowed is held where they are graded (test_reference_and_naive.py, test_alternatives.py): a refused op
makes the grading an error, which neither a pass nor a naive answer's failure of its own checks can be."""

import pytest
import torch
import torch.nn.functional as F
from sim_helpers import site_in

from puzzles import sim
from puzzles.simulator import op_costs
from puzzles.simulator.op_costs import DECOMPOSE, FREE, REFUSED, rule_of

F64 = torch.float64


def test_every_registered_aten_op_is_costed_a_view_or_refused():
    """The surface, enumerated: each overload torch registers gets FREE, a rule op_costs can apply, DECOMPOSE (a
    composite op that reached the mode whole: its parts are charged), or REFUSED."""
    rules = {}
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            func = getattr(packet, overload)
            rule = rule_of(func)
            assert rule is FREE or rule is REFUSED or rule is DECOMPOSE or rule[1] in op_costs._APPLY, (func, rule)
            rules[str(func)] = rule
    assert len(rules) > 1000
    for name in ("aten.mm.default", "aten.add.Scalar_out", "aten.mul.Scalar_out", "aten.cumsum.default",
                 "aten.sort.default", "aten.floor_divide.default", "aten.conv_tbc.default"):
        assert rules[name] not in (FREE, REFUSED), name
    for name in ("aten._pdist_forward.default", "aten._weight_int8pack_mm.default", "aten.mkldnn_rnn_layer.default"):
        assert rules[name] is REFUSED, name


def flops_of(work, inputs) -> int:
    [flops] = sim.run(lambda dist, *xs: work(*xs), 1, args=inputs).flops
    return flops


def randn(*shape):
    return torch.randn(*shape, dtype=F64)


@pytest.mark.parametrize("name, make, work", [
    ("embedding_bag with per_sample_weights", lambda: (torch.arange(64).view(8, 8), randn(100, 512)),
     lambda i, w: F.embedding_bag(i, w, per_sample_weights=torch.ones(8, 8, dtype=F64), mode="sum")),
    ("conv_tbc", lambda: (randn(16, 4, 32), randn(3, 32, 64)),
     lambda x, w: torch.conv_tbc(x, w, torch.zeros(64, dtype=F64))),
    ("slow_conv_dilated2d", lambda: (randn(1, 8, 16, 16), randn(8, 8, 3, 3)),
     lambda x, w: torch.ops.aten.slow_conv_dilated2d(x, w, [3, 3], None, [1, 1], [1, 1], [2, 2])),
    ("slow_conv3d", lambda: (randn(1, 4, 8, 8, 8), randn(4, 4, 3, 3, 3)),
     lambda x, w: torch.ops.aten.slow_conv3d(x, w, [3, 3, 3])),
    ("slow_conv_transpose2d", lambda: (randn(1, 8, 8, 8), randn(8, 8, 3, 3)),
     lambda x, w: torch.ops.aten.slow_conv_transpose2d(x, w, [3, 3])),
    ("_addmm_activation", lambda: (randn(64, 64), randn(64, 64)),
     lambda a, b: torch.ops.aten._addmm_activation(torch.zeros(64, dtype=F64), a, b)),
    ("_int_mm", lambda: (torch.ones(32, 32, dtype=torch.int8), torch.ones(32, 32, dtype=torch.int8)),
     lambda a, b: torch.ops.aten._int_mm(a, b)),
    ("index_put_ with accumulate=True", lambda: (torch.zeros(10, dtype=torch.long), torch.ones(10, 100, dtype=F64)),
     lambda i, v: torch.zeros(10, 100, dtype=F64).index_put_((i,), v, accumulate=True)),
    ("scatter_ with reduce='add'", lambda: (torch.zeros(10, 100, dtype=torch.long), torch.ones(10, 100, dtype=F64)),
     lambda i, v: torch.zeros(1, 100, dtype=F64).scatter_(0, i, v, reduce="add")),
    ("a complex product", lambda: (randn(32, 32, 2), randn(32, 32, 2)),
     lambda a, b: torch.view_as_complex(a) @ torch.view_as_complex(b)),
])
@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
def test_the_ops_once_charged_below_their_work_are_charged_as_the_sums_they_are(name, make, work):
    """Issue 29 found each of these charged far below its work (embedding_bag's weighted sums 1 FLOP an entry,
    the slow convolutions and _int_mm by their largest tensor, accumulating writes as moves, a complex product as
    one real one). Each is charged at least its multiply-adds now."""
    expected = {
        "embedding_bag with per_sample_weights": 2 * 64 * 512,  # every index's row, multiplied and added
        "conv_tbc": 2 * 14 * 4 * 64 * 3 * 32,  # output [14, 4, 64], kernel 3 x 32 inputs
        "slow_conv_dilated2d": 2 * 8 * 12 * 12 * 8 * 9,  # output 8 x 12 x 12, 8 inputs x 3 x 3 each
        "slow_conv3d": 2 * 4 * 6 ** 3 * 4 * 27,
        "slow_conv_transpose2d": 2 * 8 * 8 * 8 * 8 * 9,  # transposed: every input element x the kernel
        "_addmm_activation": 2 * 64 ** 3,
        "_int_mm": 2 * 32 ** 3,
        "index_put_ with accumulate=True": 10 * 100,
        "scatter_ with reduce='add'": 10 * 100,
        "a complex product": 4 * 2 * 32 ** 3,  # four real products
    }[name]
    assert flops_of(work, make()) >= expected


def test_a_custom_op_is_refused_on_a_rank():
    """torch.library.custom_op runs its body with the dispatch modes popped: the op itself reaches the mode, has no
    formula, and is refused."""
    @torch.library.custom_op("puzzles_test::double_it", mutates_args=())
    def double_it(x: torch.Tensor) -> torch.Tensor:
        return x @ torch.eye(x.shape[-1], dtype=x.dtype) * 2

    def fn(dist):
        return double_it(torch.ones(4, 4, dtype=F64))  # custom-op

    with pytest.raises(sim.UncostedOpError) as info:
        sim.run(fn, 1)
    text = str(info.value)
    assert "puzzles_test.double_it has no cost formula" in text and site_in(__file__, "custom-op") in text, text


def test_a_composite_op_that_reaches_the_mode_whole_is_charged_by_its_parts():
    """Under torch.inference_mode(), torch skips the decomposition of matmul and linear: they reached the mode whole
    and were charged by their elements (a product for the price of a copy). Now their parts are charged."""
    def fn(dist, a):
        with torch.inference_mode():
            return a @ a, torch.nn.functional.linear(a, a)

    [flops] = sim.run(fn, 1, args=(randn(64, 64),)).flops
    assert flops >= 2 * (2 * 64 ** 3)


def test_autograds_anomaly_mode_runs_in_a_rank_and_ends_with_the_run():
    """p22's story points to torch.autograd.set_detect_anomaly(True): its backward asks each op's output whether
    any entry is nan (aten._is_any_true), charged as a reduction, and the process-wide switch is put back after
    the run, so that a later run does not check (and pay for) every backward op."""
    def step(dist):
        torch.autograd.set_detect_anomaly(True)
        w = torch.ones(8, 8, dtype=F64, requires_grad=True)
        (w @ w).sum().backward()
        return w.grad.sum().item()

    before = torch.is_anomaly_enabled()
    result = sim.run(step, 1)
    assert result.results == [1024.0]  # each entry of the gradient of sum(w @ w) at ones: 2·8
    assert torch.is_anomaly_enabled() == before
    assert rule_of(torch.ops.aten._is_any_true.default) not in (FREE, REFUSED)
