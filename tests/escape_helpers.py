"""Rank programs for test_escapes.py (module level, so that real processes can import them by name)."""

import mmap
import os

import torch


def dispatch_off(dist):
    """torch's dispatch modes switched off through names computed at run time (the static scan cannot see them)."""
    module = getattr(torch.utils, "_python" + "_dispatch")
    with getattr(module, "_disable" + "_current_modes")():
        return (torch.ones(64, 64) @ torch.ones(64, 64)).sum()


def dispatch_key_excluded(dist):
    """The Python dispatch key excluded from the thread's dispatch: the same escape through torch._C."""
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
    with getattr(torch._C, "_Exclude" + "DispatchKeyGuard")(keys):
        return (torch.ones(64, 64) @ torch.ones(64, 64)).sum()


def writes_a_file(dist):
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"escape-test-{os.getpid()}-{dist.get_rank()}.bin")
    try:
        with open(path, "wb") as f:
            f.write(bytes(4096))
    finally:
        if os.path.exists(path):
            os.remove(path)
    return 1


def saves_to_a_path(dist):
    """torch.save on a path opens the file in C++, where no audit event is raised."""
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"escape-test-{os.getpid()}-{dist.get_rank()}.pt")
    try:
        torch.save({"step": 1}, path)
    finally:
        if os.path.exists(path):
            os.remove(path)
    return 1


def maps_memory(dist):
    with mmap.mmap(-1, 1 << 20) as m:
        m[:4] = b"keep"
    return 1


def prints_and_reads(dist):
    """What a rank may do: print a tensor (torch switches the modes off itself, to format it) and read a file."""
    text = str(torch.arange(6.0).reshape(2, 3))
    with open(__file__) as f:
        first = f.readline()
    return len(text) + len(first)


REFUSED = {dispatch_off: "switched torch's dispatch modes off", dispatch_key_excluded: "switched torch's dispatch",
           writes_a_file: "for writing", saves_to_a_path: "called torch.save on the path", maps_memory: "mapped memory"}
