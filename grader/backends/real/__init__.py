"""The real backend: the same puzzle function, run by N operating-system processes on torch.distributed.

    python -m grader check solutions --backend torch          (gloo processes on this machine's CPU)
    torchrun --nproc-per-node 4 -m grader.launch p3 --target solutions   (a real cluster; see launch.py)

On the simulator, `dist` is the simulator's mirror of torch.distributed; here it is `torch.distributed` itself,
in N processes started with torch.multiprocessing, joined in one gloo process group (NCCL on GPUs). Each process
runs the spec's `program` exactly as a simulated rank does and sends back plain data, from which the parent
builds the same `Observation` the simulator gives, so `spec.check` grades both with the same code.

What each process measures, with the same definitions as the simulator (puzzles/simulator/memory.py, clock.py):
- **memory**: a TorchDispatchMode of its own (`ProcessTracker`) charges every storage an op materialises to the
  same `Ledger` class the simulator uses, with the same `StorageTracker`; the inputs are placed on the rank the
  same way (a private copy, charged as "input placed on the rank"). So peak memory is the same figure.
- **communication**: c10d's collectives are dispatcher ops (`c10d.allreduce_`, `c10d._allgather_base_`,
  `c10d.send`, ...), so the same mode sees each one, with its bytes, its group and whether autograd's backward
  issued it: the counts and volumes that the specs check. A blocking op goes to the backend on private copies of
  the learner's tensors (see `_through_private_buffers`: otherwise gloo's worker thread decides when a tensor
  leaves the ledger, and peaks change from run to run).
- **errors**: TORCH_DISTRIBUTED_DEBUG=DETAIL, so collectives that do not match across ranks fail with PyTorch's
  own fingerprints instead of hanging; each rank's error comes back with the learner's line; a rank blocked in a
  communication says which (kind, peer, line) when the backend's time limit fires.
- **compute**: FLOPs per op by the simulator's formulas, laid end to end in ticks: a rank's compute stream
  without the waits. FLOP counts are exact on real processes; the *timeline* is not.

What only the simulated clock can measure (makespan, bubble, overlap) is reported as "simulator only": real
processes on a shared CPU have no clock that means the same thing on every machine.

How a group runs: the parent hosts a TCPStore on a port the OS picks, starts N processes (a forkserver that has
already imported torch, so a group costs a fraction of a second after the first), and each process runs the
puzzles it is given one after another, each in a fresh process group (so a message a wrong answer left unmatched
cannot leak into the next puzzle). Results come back as files (torch.save, loaded with weights_only=True).
Every path ends with every process gone: a rank that raises, a rank that dies, a group that hangs past its time
limit (the hung ranks' Python stacks are dumped first, to say where each one waits).

The files of this folder:

    rank.py      one process: runs a task on its rank under the tracker, writes plain data back
    tracker.py   the tracker: the simulator's ledger, FLOP count and the communication c10d's ops show
    group.py     the parent: starts N processes, collects each task, never leaves a process behind
    reports.py   what went wrong, in words (shared with torchrun's launcher, frontends/launch.py)
    grading.py   payloads -> Observation -> core/grading.py, for a folder of puzzle files
    launches.py  a job of several launches (p18), each a fresh group, on a folder that outlives them
    disk.py      the checkpoint disk as a real folder, and a process that dies at its crash point
    compare.py   the simulator and real processes side by side (does the simulator mean the same thing?)
"""

from __future__ import annotations

from .compare import Comparison, compare
from .grading import grade_files, grade_folder
from .group import DEFAULT_TIMEOUT, TaskOutcome, observation, run, run_tasks
from .rank import FunctionTask, PuzzleTask, device_for, enable_debug_detail, execute
from .reports import classify, describe_errors, describe_hang
from .tracker import ProcessTracker

__all__ = ["run", "run_tasks", "grade_files", "grade_folder", "observation", "PuzzleTask", "FunctionTask", "execute",
           "compare", "Comparison", "ProcessTracker", "DEFAULT_TIMEOUT", "TaskOutcome", "classify",
           "describe_errors", "describe_hang", "device_for", "enable_debug_detail"]
