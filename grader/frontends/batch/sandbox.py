"""The operating system's isolation for `batch`: what each puzzle's process may see, write, start and use.

`probe()` picks the strongest mode this machine allows, once per batch (docs/grading.md, "Grading for credit"):

    namespaces  Linux, run as root. Each puzzle runs in new mount, PID, network, IPC and UTS namespaces, in a root
                of its own (pivot_root) holding only the Python installation, the grader's two packages (read-only)
                and its private copy of the submission (tmpfs), as an unprivileged uid of its own (one per job).
    userns      Linux, not root, with unprivileged user namespaces: the same namespaces and root, inside a user
                namespace, with every capability dropped (the learner's code runs as the instructor's uid, but
                sees and writes only the jail).
    process     anywhere else (macOS, a container that forbids namespaces): a private copy in a scratch folder,
                its own session, a subreaper that kills what it started, resource limits. No file isolation.

Everything here runs in the zygote's single-threaded children (zygote.py), never in the batch's own process.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import reaper

try:
    import resource  # imported here, in the zygote: a jailed uid may not be able to read the standard library
except ImportError:  # Windows: batch refuses to start (see run_batch)
    resource = None

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NAMESPACES = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 24, 28, 38, 36
PR_GET_CHILD_SUBREAPER = 37
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}.get(platform.machine())

SANDBOX_UID = 2_000_000_000  # far above any login or subuid range: the first uid a batch's jobs may run as
JOBS_PER_BATCH = 256  # a batch takes a block of this many uids (job slot i runs as uid and gid block + i)


def uid_block(batch_pid: int) -> int:
    """The first uid of the block of the batch whose parent has this process id: two batches running at once on
    one machine never share a uid, so neither kills the other's puzzles when it sweeps its own uids. (Process ids
    are below 2**22 on Linux: the last block ends at 3,073,741,823, below the largest uid.)"""
    return SANDBOX_UID + (batch_pid % (1 << 22)) * JOBS_PER_BATCH
NPROC = 128  # processes *and threads* a puzzle may have at once (a 4-rank simulation uses 6)
FILE_MB = 64  # the largest file a puzzle may write (RLIMIT_FSIZE)
SCRATCH = "size=64m,nr_inodes=4096,mode=0755"  # the tmpfs of the private copy and of /tmp
SUBMISSION = "/submission"  # where the private copy appears inside the jail

GUARANTEES = {
    "namespaces": "each puzzle in its own mount, PID, network and IPC namespaces, in a root holding only Python and "
                  "the grader, as an unprivileged uid of its own; it sees no other submission, no solutions/, no "
                  "results, and nothing it starts outlives it",
    "userns": "each puzzle in its own user, mount, PID, network and IPC namespaces, in a root holding only Python "
              "and the grader, with no capabilities; it sees no other submission, no solutions/, no results, and "
              "nothing it starts outlives it",
    "process": "each puzzle in its own process and session, killed with all it starts; NO file isolation: a "
               "learner's code can read and write what you can (run as root with namespaces, or in a container, "
               "for the full sandbox)",
}

_libc = ctypes.CDLL(None, use_errno=True) if os.name == "posix" else None


class SandboxError(OSError):
    """A mechanism of the sandbox failed (the probe turns this into a weaker mode, with a note)."""


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SandboxError(err, f"{what}: {os.strerror(err)}")


def prctl(option: int, arg: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def subreaper(on: bool) -> bool:
    """Make this process the reaper of its descendants' orphans (Linux), or stop; returns whether it was one.
    Elsewhere a no-op that returns False (macOS has no subreaper: see the README)."""
    if sys.platform != "linux" or _libc is None:
        return False
    was = ctypes.c_int(0)
    _libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
    prctl(PR_SET_CHILD_SUBREAPER, int(on))
    return bool(was.value)


def mount(source, target, fstype, flags: int, data: str | None = None) -> None:
    enc = (lambda s: s.encode() if s is not None else None)
    _check(_libc.mount(enc(source), enc(str(target)), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


@dataclass
class Policy:
    """What every puzzle's jail does in this batch: the mode, and what it leaves out (for the opening message)."""

    mode: str  # namespaces | userns | process
    uid_base: int | None = None  # a uid of its own per job slot (root only)
    binds: list[str] = field(default_factory=list)  # read-only inside the jail, at the same paths
    links: dict[str, str] = field(default_factory=dict)  # /bin -> usr/bin and the like
    masks: list[str] = field(default_factory=list)  # inside a bound folder but hidden (an installed solutions/)
    notes: list[str] = field(default_factory=list)

    def uid(self, slot: int) -> int | None:
        return None if self.uid_base is None else self.uid_base + slot


# ---- what the jail holds


def jail_contents(packages: list[Path]) -> tuple[list[str], dict[str, str], list[str]]:
    """(folders bound read-only, symlinks, folders masked): the Python installation and the grader's packages.
    Only what is needed to import the grader, torch and the standard library: never the repository (solutions/,
    tests/, other submissions), the home folder or the results."""
    binds, links = [], {}
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            links[top] = os.readlink(top)
        elif os.path.isdir(top):
            binds.append(top)
    binds += [f for f in ("/etc/ld.so.cache", "/etc/localtime") if os.path.isfile(f)]
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        binds.append(os.path.realpath(prefix))
    binds += [str(p.resolve()) for p in packages]
    binds = sorted({b for b in binds if not any(b != o and b.startswith(o.rstrip("/") + "/") for o in binds)})
    import site

    places = [*sys.path, *site.getsitepackages(), *(str(p.parent) for p in packages)]
    masks = sorted({os.path.realpath(os.path.join(p, "solutions")) for p in places
                    if p and os.path.isdir(os.path.join(p, "solutions"))})
    return binds, links, [m for m in masks if any(m.startswith(b + "/") for b in binds)]


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def enter_namespaces(policy: Policy) -> None:
    """Warden side, before forking the puzzle's process: that process will be PID 1 of a new PID namespace."""
    if policy.mode == "userns":
        uid, gid = os.getuid(), os.getgid()
        unshare(CLONE_NEWUSER | NAMESPACES)
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    else:
        unshare(NAMESPACES)
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted from here on is seen outside


def build_root(policy: Policy, root: Path, copy: Path, owner: int | None) -> None:
    """Warden side: a tmpfs at `root` holding the binds, /dev's harmless devices, a fresh /tmp and a fresh copy of
    the submission at /submission (owned by the puzzle's uid: its own to change)."""
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    ids = "" if owner is None else f",uid={owner},gid={owner}"
    for name, options in (("tmp", SCRATCH.replace("0755", "1777")), (SUBMISSION.lstrip("/"), SCRATCH + ids)):
        (root / name).mkdir()  # first: a bound folder may live under /tmp (a virtualenv there)
        mount("tmpfs", root / name, "tmpfs", MS_NOSUID | MS_NODEV, options)
    for path in policy.binds:
        inside = root / path.lstrip("/")
        if os.path.isdir(path):
            inside.mkdir(parents=True, exist_ok=True)
        else:
            inside.parent.mkdir(parents=True, exist_ok=True)
            inside.touch()
        mount(path, inside, None, MS_BIND | MS_REC)
        mount(None, inside, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for path in policy.masks:
        mount("tmpfs", root / path.lstrip("/"), "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
    for link, target in policy.links.items():
        (root / link.lstrip("/")).symlink_to(target)
    for f in copy.iterdir():
        shutil.copyfile(f, root / SUBMISSION.lstrip("/") / f.name)
        if owner is not None:
            os.chown(root / SUBMISSION.lstrip("/") / f.name, owner, owner)
    (root / "dev").mkdir()
    for dev in ("null", "zero", "random", "urandom"):
        (root / "dev" / dev).touch()
        mount(f"/dev/{dev}", root / "dev" / dev, None, MS_BIND)
    (root / "proc").mkdir()


def enter_root(root: Path) -> None:
    """Puzzle side (PID 1 of the new namespace): its own /proc, then pivot_root into the jail and let the old root
    go, so that no path (and no chroot trick) leads back to the machine's files."""
    mount("proc", root / "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    unshare(CLONE_NEWNS)  # the warden keeps its view; this process's pivot_root changes only its own
    (root / ".old").mkdir()
    _check(_libc.syscall(PIVOT_ROOT, str(root).encode(), str(root / ".old").encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", 2), "umount the old root")  # 2: MNT_DETACH
    os.rmdir("/.old")


def drop_privileges(policy: Policy, slot: int) -> None:
    """Puzzle side: as root, become the slot's own uid (which clears every capability); in a user namespace, drop
    every capability for good. Either way no set-uid program can give any back (no_new_privs)."""
    if sys.platform == "linux":
        for cap in range(64):
            if _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
                break  # past the last capability this kernel knows
    uid = policy.uid(slot)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    elif policy.mode == "userns":
        prctl(PR_SET_SECUREBITS, 0x0F)  # root inside gets no capabilities back through execve or setuid
        _libc.prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        _check(_libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")
    if sys.platform == "linux":
        prctl(PR_SET_NO_NEW_PRIVS, 1)


def vm_size() -> int:
    """This process's mapped address space in bytes (the zygote's share is inherited by every puzzle)."""
    return int(reaper.status_of(os.getpid()).get("VmSize", "0 kB").split()[0]) * 1024


def set_limits(memory_mb: int, seconds: float, policy: Policy) -> None:
    """Puzzle side: the address space above what the zygote already maps (so a CUDA build of torch, which maps
    gigabytes it never touches, still gets `memory_mb` of its own), processes, CPU seconds, files, core dumps."""
    def cap(which, soft, hard=None):
        _, old_hard = resource.getrlimit(which)
        hard = soft if hard is None else hard
        if old_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, old_hard), min(hard, old_hard)
        resource.setrlimit(which, (soft, hard))

    if sys.platform == "linux":  # RLIMIT_AS is not enforced on macOS (docs/grading.md)
        cap(resource.RLIMIT_AS, vm_size() + (memory_mb << 20))
        cap(resource.RLIMIT_NPROC, NPROC + (0 if policy.uid_base is not None else reaper.processes_of(os.getuid())))
    cap(resource.RLIMIT_CPU, int(seconds) + 2, int(seconds) + 5)
    cap(resource.RLIMIT_FSIZE, FILE_MB << 20)
    cap(resource.RLIMIT_NOFILE, 256)
    cap(resource.RLIMIT_CORE, 0)
