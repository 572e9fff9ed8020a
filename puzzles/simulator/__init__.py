"""The simulator's insides. Start at ../sim.py (the entry point and the map); to learn what an all-reduce does,
read collectives.py.

    collectives.py  what each collective does to the data (the teaching part), and the records that are matched
    types.py        the errors (each says when it is raised), ReduceOp, ProcessGroup, P2POp, Work
    dist.py         `dist`: the torch.distributed API as one rank sees it; each call becomes a record, after the
                    checks gloo would fail (reduce ops and dtypes, non-contiguous tensors)
    world.py        one run: the rank threads and the baton that passes between them, the supervisor
    matching.py     pairs sends with recvs, gathers the ranks of a collective (every input read before any output
                    is written)
    handles.py      work handles: tensors in flight until wait(), wait() once, every handle waited for
    deadlock.py     what a stuck run looks like: each rank's pending call, its lines, what it last computed
    failures.py     a rank's own error (the others run on), which thread may call dist, stopping stuck threads
    mode.py         the TorchDispatchMode that sees every op of a rank: isolation, memory, its cost on the clock
    allowed.py      what a rank may do, as a list of what is allowed: the policy; threads and processes refused
    guards.py       inside a rank, tensors stay tensors: no numpy, list or bytes copies the ledger cannot see
    memory.py       the memory ledger (bytes alive per rank, the peak, who allocated it)
    clock.py        the clock: a compute stream and a communication queue per rank (issue order), in ticks
    cost.py         the cost model: the device profile (a roofline) and the network (latency and bandwidth)
    op_costs.py     what each aten op costs: its FLOPs and the bytes it reads and writes
    tally.py        what a piece of code costs on the simulated GPU, outside any run (sim.tally)
    filesystem.py   a disk shared by the ranks and the runs of a job (open, rename, torch.save), what survives a
                    crash, and a rank made to die at a chosen point (checkpoints and recovery)

Part IV, debugging a run (each off unless a run asks for it; a puzzle that does not leaves its figures as they were):
    watchdog.py         collective timeouts (init_process_group's timeout=): NCCL's watchdog on the clock
    flight_recorder.py  each rank's ring buffer of its last communication calls (torch's Flight Recorder)
    fr_analysis.py      a dump read as torch's fr_trace reads it: the first collective where the ranks part
    host.py             the host that launches a rank's ops ahead of the device, and the syncs that stop it
    loader.py           DataLoader: torch's batches, loaded by the host (num_workers=0) or by workers

Data flows one way: learner code -> dist.py -> world.py/matching.py -> collectives.py moves the data ->
memory.py and clock.py record it -> sim.run returns it. These modules meet each other only through imports
under `if TYPE_CHECKING:` where they would otherwise go in a circle.
"""
