"""Finding and killing processes for the batch sandbox: children, every process of a uid, orphans.

Read from /proc (Linux). A subreaper (the zygote, each warden) inherits the orphans of what it started, so killing
its children until none is left kills a tree that escaped its process group; a uid's processes die together
through kill(-1) from that uid, which the kernel applies under one lock, so none can fork away.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path


def _proc_entries():
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def status_of(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:  # gone already
        return {}


def children_of(pid: int) -> list[int]:
    """The children of a process: from /proc/PID/task/*/children where the kernel has it (one read per thread),
    else by scanning every process's parent."""
    try:
        return [int(c) for task in os.listdir(f"/proc/{pid}/task")
                for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    except OSError:
        return [p for p in _proc_entries() if status_of(p).get("PPid", "").strip() == str(pid)]


def processes_of(uid: int) -> int:
    return sum(status_of(p).get("Uid", "").split()[:1] == [str(uid)] for p in _proc_entries())


def kill_uid(uid: int) -> None:
    """Every process of a sandbox uid, at once: a helper becomes that uid and sends SIGKILL to -1 (the kernel
    delivers it to all of them under one lock, so none can fork away)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def sweep_uid(uid: int) -> int:
    """From a process that must not fork (the batch's parent has threads): kill every process of `uid` found in
    /proc, round after round, until a round finds none. Returns how many were killed."""
    killed = 0
    for _ in range(100):
        found = [p for p in _proc_entries() if status_of(p).get("Uid", "").split()[:1] == [str(uid)]]
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


def kill_strays(keep) -> int:
    """Kill and reap every child of this process but those in `keep` (its own workers, and the children it had
    before): in a subreaper, the orphans of what it started, a daemon that killed its warden and its zygote
    included. Round after round until none is left; returns how many were killed."""
    killed = 0
    for _ in range(1000):
        strays = [pid for pid in children_of(os.getpid()) if pid not in keep]
        if not strays:
            break
        for pid in strays:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        for pid in strays:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    return killed


def reap_children() -> None:
    """Kill and reap every child of this process (a subreaper: orphans of what it started are its children),
    until none is left; a fork bomb is bounded by RLIMIT_NPROC."""
    for _ in range(1000):
        kids = children_of(os.getpid())
        if not kids:
            break
        for kid in kids:
            try:
                os.kill(kid, signal.SIGKILL)
            except OSError:
                pass
        for kid in kids:
            try:
                os.waitpid(kid, 0)
            except ChildProcessError:
                pass
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                break
        except ChildProcessError:
            break
