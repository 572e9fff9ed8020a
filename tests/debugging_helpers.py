"""Rank programs for the Part IV simulator tests (tests/test_sim_flight_recorder.py, ...): each runs on the simulator
and on gloo processes, so it lives in a module of its own, importable by name in every process of a real group."""

import torch


def skips_a_step(dist):
    """Rank 2 skips step 1's all-reduce (a data-dependent skip): its step-2 all-reduce meets the others' step-1 one,
    and the others' third all-reduce has no partner. On gloo, the waiting ranks catch the timeout and return the
    flight recorder's dump (torch 2.13 records gloo's collectives by default)."""
    t = torch.ones(4, dtype=torch.float64)
    error = ""
    try:
        for step in range(3):
            if dist.get_rank() == 2 and step == 1:
                continue
            dist.all_reduce(t)
    except RuntimeError as exc:  # gloo's timeout (the simulator raises its own, which is no RuntimeError)
        error = str(exc)
    return {"dump": _torch_dump(dist), "error": error}


def agreeing_calls(dist):
    """Every rank makes the same collectives, of several kinds: the records agree everywhere."""
    t = torch.full((4,), float(dist.get_rank()), dtype=torch.float64)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    gathered = [torch.empty(4, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, t)
    dist.barrier()
    dist.all_reduce(torch.ones(2, 3))
    return {"dump": _torch_dump(dist), "error": ""}


def _torch_dump(dist) -> str:
    """The process's flight recorder dump on real torch.distributed ("" on the simulator: its dump is the run's)."""
    if dist.get_backend() == "sim":
        return ""
    import torch._C._distributed_c10d as c10d

    return c10d._dump_fr_trace_json(True, True)
