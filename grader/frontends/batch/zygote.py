"""The batch's worker: one process that has imported torch and the grader once, and forks a fresh jail per puzzle.

    batch (parent)                       never runs a learner's code; decides every verdict
      └─ zygote (`python -m grader _zygote`)   torch imported, one thread, a subreaper; serves one job slot
           └─ warden (fork, per puzzle)        trusted: builds the jail, keeps the time, kills, reports
                └─ puzzle (fork)               PID 1 of new namespaces, in the jail, unprivileged: runs one puzzle

The parent sends one request per puzzle over a socket; the warden answers on the same socket with the puzzle's
exit, its output's tail and its record (record.py's bytes, which the parent alone parses and checks). The puzzle's
process never holds that socket: it writes its record to a pipe that only the warden reads (first a byte that
says the jail was entered: an exit after it is the learner's), and its stdout and stderr to another, of which the
warden keeps the last few kilobytes. The parent also sends each notebook here to be read (read_notebook: a child
with a time and a memory limit writes its puzzles into the parent's private copy), so that the parent never
parses a learner's data itself. Forking from one thread after torch was
told to use one thread is what makes this safe (OpenMP pools and BLAS threads do not survive a fork).
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

from . import reaper, sandbox
from .sandbox import Policy
from .runner import JAILED
from .wire import MAX_RECORD_MB, receive, send

OUTPUT_TAIL = 4096  # bytes of a puzzle's own output kept for its error message


# ---- the zygote


def serve(fd: int, requested: str, slot: int) -> None:
    """`python -m grader _zygote`: import, probe the sandbox, warm up, then fork a warden per request."""
    sock = socket.socket(fileno=fd)
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    from ...specs import SPECS  # noqa: F401  (every spec, imported once for every child)
    from .runner import warm_up

    warm_up()
    _warm_notebook_reader()
    mountpoint = tempfile.mkdtemp(prefix="grader-jail-")  # each warden mounts its jail here, in its own namespace
    try:
        _serve(sock, requested, slot, mountpoint)
    finally:
        os.rmdir(mountpoint)


def _warm_notebook_reader() -> None:
    """Import nbformat and compile its schema once, here (measured: 1.7 s for the first notebook read, 0.03 s for
    each after), so that no notebook's reader pays it within its time limit."""
    try:
        import nbformat
    except ImportError:  # no notebooks to read without it: each will say so
        return
    from ..notebooks.cells import learner_cells

    learner_cells(nbformat.reads(nbformat.writes(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("x = 1")])), as_version=4))


_CURRENT: list = [None]  # the warden at work, if any


def _on_term(signum, frame) -> None:
    """SIGTERM from the parent (the batch ends or is interrupted): pass it to the warden at work, which kills its
    puzzle and everything the puzzle started; when idle, leave."""
    if _CURRENT[0] is None:
        raise SystemExit(0)
    os.kill(_CURRENT[0], signal.SIGTERM)


def _serve(sock, requested: str, slot: int, mountpoint: str) -> None:
    from ...backends.tamper import Fingerprint

    try:
        policy = probe(requested, mountpoint)
    except sandbox.SandboxError as exc:
        send(sock, {"ready": False, "error": exc.strerror})
        return
    signal.signal(signal.SIGTERM, _on_term)
    if sys.platform == "linux":  # (macOS has no subreaper: docs/grading.md)
        sandbox.prctl(sandbox.PR_SET_CHILD_SUBREAPER, 1)
    pristine = Fingerprint()  # before any learner's code: each puzzle's process compares against it
    gc.collect()
    gc.freeze()  # the children's garbage collector leaves the zygote's pages shared
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    send(sock, {"ready": True, "mode": policy.mode, "uid": policy.uid(slot), "notes": policy.notes,
                "threads": threads, "pid": os.getpid()})
    while True:
        try:
            request, _ = receive(sock)
        except (EOFError, ConnectionError):
            break
        if "notebook" in request:
            send(sock, read_notebook(request))
            continue
        request["mountpoint"] = mountpoint
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # until each side has its own handler
        pid = os.fork()
        if pid == 0:
            _warden(sock, request, policy, slot, pristine)
        _CURRENT[0] = pid
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        _, status = os.waitpid(pid, 0)
        _CURRENT[0] = None
        if os.waitstatus_to_exitcode(status) != 0:  # the warden failed before answering (see the zygote's log)
            try:
                send(sock, {"puzzle": request.get("puzzle"), "warden_error": f"status {status}"})
            except OSError:  # the parent has gone
                break
        if policy.mode == "process" and policy.uid(slot) is not None:  # (in a PID namespace, all died with it)
            reaper.kill_uid(policy.uid(slot))  # every process of the slot's uid, wherever it went
        reaper.reap_children()  # anything orphaned onto the zygote
    reaper.reap_children()


def read_notebook(request: dict) -> dict:
    """Read a notebook's puzzles into the parent's private copy, in a child of the zygote's with a time limit and a
    memory limit: a notebook is the learner's data, and reading it (JSON, nbformat, the cells' Python) must never
    make the batch wait or take its memory. {"error": ""} when done, else why not."""
    import resource

    from .submissions import copy_notebook

    read_r, write_w = os.pipe()
    had = set(reaper.children_of(os.getpid()))  # (in a test's process: its own, a multiprocessing forkserver say)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_r)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            if sys.platform == "linux":
                sandbox.prctl(sandbox.PR_SET_PDEATHSIG, signal.SIGKILL)
                resource.setrlimit(resource.RLIMIT_AS, (sandbox.vm_size() + (1 << 30),) * 2)
            seconds = int(request["timeout"]) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
            os.write(write_w, copy_notebook(Path(request["notebook"]), Path(request["into"])).encode()[:4096])
            code = 0
        finally:
            os._exit(code)
    _CURRENT[0] = pid
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os.close(write_w)
    status, timed_out, said, _, _ = _watch(pid, read_r, None, time.monotonic() + request["timeout"], keep=had)
    _CURRENT[0] = None
    if timed_out:
        return {"error": f"could not read the notebook within {request['timeout']} s"}
    if status != 0:
        why = f"exit status {os.waitstatus_to_exitcode(status)}" if os.WIFEXITED(status) else \
            f"signal {os.WTERMSIG(status)}: out of time or memory?"
        return {"error": f"could not read the notebook (the reader ended with {why})"}
    return {"error": said.decode(errors="replace")}


def probe(requested: str, mountpoint: str) -> Policy:
    """The strongest mode that works here, tried for real: a jail is built and entered once per candidate."""
    import puzzles

    grader = Path(__file__).resolve().parents[1]
    binds, links, masks = sandbox.jail_contents([grader, Path(puzzles.__file__).resolve().parent])
    root = os.geteuid() == 0
    wanted = ["namespaces", "userns", "process"] if requested == "auto" else [requested]
    notes = []
    for mode in wanted:
        uids = sandbox.uid_block(os.getppid())  # (the zygote's parent is the batch's)
        policy = Policy(mode, uids if root and mode != "userns" else None, binds, links, masks)
        why = _unavailable(policy, mountpoint)
        if mode == "process" and why and policy.uid_base is not None:  # root, but the uid cannot read Python
            notes.append(f"process mode cannot run as a uid of its own ({why}): the learner's code runs as root")
            policy.uid_base = None
            why = _unavailable(policy, mountpoint)
        if not why:
            policy.notes = notes
            return policy
        notes.append(f"{mode} unavailable: {why}")
    raise sandbox.SandboxError(0, "; ".join(notes))


def _unavailable(policy: Policy, mountpoint: str) -> str:
    """'' if a jail of this policy can be built and entered here, else why not."""
    if sys.platform != "linux" and policy.mode != "process":
        return "needs Linux"
    if policy.mode == "namespaces" and os.geteuid() != 0:
        return "needs root"
    if policy.mode != "process" and not sandbox.PIVOT_ROOT:
        return "pivot_root's system call number is unknown on this machine"
    with tempfile.TemporaryDirectory(prefix="grader-probe-") as copy:
        left, right = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            left.close()
            _warden(right, {"probe": True, "copy": copy, "timeout": 20, "memory_mb": 512, "mountpoint": mountpoint},
                    policy, 0, {})
        right.close()
        try:
            header, payload = receive(left, time.monotonic() + 30)
        except (EOFError, TimeoutError) as exc:
            header, payload = {"warden_error": str(exc)}, b""
        os.waitpid(pid, 0)
        left.close()
    if payload == b"ok":
        return ""
    last = header.get("output", "").strip().splitlines()[-1:]
    return header.get("warden_error") or (last[0] if last else f"the trial jail failed ({header})")


# ---- the warden (trusted) and the puzzle's process


def _warden(sock, request: dict, policy: Policy, slot: int, pristine: dict) -> None:
    """Build the jail, fork the puzzle's process, keep its time, kill everything it started, answer."""
    code = 1
    try:
        if sys.platform == "linux":
            sandbox.prctl(sandbox.PR_SET_PDEATHSIG, signal.SIGKILL)
        reply, payload = _guard(request, policy, slot, pristine, sock)
        send(sock, reply, payload)
        code = 0
    except BaseException as exc:  # a failure of the sandbox's own (see the zygote's log), never the learner's
        traceback.print_exc()
        try:
            send(sock, {"puzzle": request.get("puzzle"), "warden_error": f"{type(exc).__name__}: {exc}"})
            code = 0
        except OSError:
            pass
    finally:
        os._exit(code)


def _guard(request, policy, slot, pristine, sock):
    copy, uid = Path(request["copy"]), policy.uid(slot)
    if policy.mode == "process":
        jail = Path(tempfile.mkdtemp(prefix="grader-run-"))
        for f in copy.iterdir():
            (jail / f.name).write_bytes(f.read_bytes())
        if uid is not None:
            for p in (jail, *jail.iterdir()):
                os.chown(p, uid, uid)
    else:
        jail = Path(request["mountpoint"])  # the zygote's own empty folder; the tmpfs on it is this warden's only
        sandbox.enter_namespaces(policy)
        sandbox.build_root(policy, jail, copy, uid)
    if sys.platform == "linux":
        sandbox.prctl(sandbox.PR_SET_CHILD_SUBREAPER, 1)
    record_r, record_w = os.pipe()
    output_r, output_w = os.pipe()
    started = time.monotonic()
    pid = os.fork()  # SIGTERM is blocked here (see _serve)
    if pid == 0:
        from .runner import run_puzzle

        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

        for fd in (record_r, output_r, sock.fileno()):
            os.close(fd)
        run_puzzle(request, policy, slot, jail, record_w, output_w, pristine)  # never returns
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))  # the batch is ending: stop now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os.close(record_w)
    os.close(output_w)
    status, timed_out, record, output, too_big = _watch(pid, record_r, output_r, started + request["timeout"])
    if policy.mode == "process":
        import shutil

        shutil.rmtree(jail, ignore_errors=True)
    jailed = record[:1] == JAILED  # written before any learner's code: how the process ends after it is theirs
    reply = {"puzzle": request.get("puzzle"), "seconds": round(time.monotonic() - started, 3),
             "timed_out": timed_out, "exit": None, "signal": None, "too_big": too_big, "jailed": jailed,
             "output": output.decode(errors="replace")}
    record = record[1:] if jailed else b""
    if os.WIFSIGNALED(status):
        reply["signal"] = os.WTERMSIG(status)
    else:
        reply["exit"] = os.waitstatus_to_exitcode(status)
    return reply, record


def _watch(pid, record_r, output_r, deadline, keep=None):
    """Read the record and the output while the puzzle runs; at its end or its deadline, kill every process it
    started and drain what is left. Nothing it does can keep the warden waiting past the deadline."""
    import select

    pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    record, output, too_big, timed_out, status = bytearray(), bytearray(), False, False, None
    open_fds = {fd for fd in (record_r, output_r) if fd is not None}
    poller = select.poll()
    for fd in (*open_fds, *([pidfd] if pidfd is not None else [])):
        poller.register(fd, select.POLLIN)

    def read(fd) -> None:
        nonlocal too_big
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            poller.unregister(fd)
            open_fds.discard(fd)
        elif fd == record_r:
            record.extend(chunk)
            too_big = too_big or len(record) > MAX_RECORD_MB << 20
        else:
            output.extend(chunk)
            del output[:-OUTPUT_TAIL]

    while status is None and not too_big:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for fd, _ in poller.poll(min(left, 0.05 if pidfd is None else left) * 1000):
            if fd in open_fds:
                read(fd)
        done, st = os.waitpid(pid, os.WNOHANG)
        status = st if done else None
    status = _kill_all(pid, status, keep)
    for fd in tuple(open_fds):  # every writer is dead now: what is left is finite
        os.set_blocking(fd, False)
        try:
            while fd in open_fds and not too_big:
                read(fd)
        except BlockingIOError:
            pass
    for fd in (record_r, output_r, pidfd):
        if fd is not None:
            os.close(fd)
    return status, timed_out, bytes(record) if not too_big else bytes(record[:1]), bytes(output), too_big


def _kill_all(pid: int, status: int | None, keep=None) -> int:
    """The puzzle's process (PID 1 of its namespace: its death takes every process in it), its session, and
    whatever was orphaned onto the warden (a subreaper): every child of this process, or with `keep`, every child
    but those (the processes it had before it forked this one). Returns the puzzle's status. (The zygote then kills
    every process of the slot's uid, from outside the namespace.)"""
    for kill in (lambda: os.kill(pid, signal.SIGKILL), lambda: os.killpg(pid, signal.SIGKILL)):
        try:
            kill()
        except OSError:
            pass
    if status is None:
        status = os.waitpid(pid, 0)[1]
    if keep is None:
        reaper.reap_children()
    else:
        reaper.kill_strays(keep)
    return status
