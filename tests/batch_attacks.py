"""Adversarial submissions for the batch sandbox's tests: each tries to break one guarantee of the threat model
(docs/grading.md, "Grading for credit"). Every attack is written as a determined learner would write it, knowing the
paths the instructor uses (the worst case), and records what it managed in a way the tests can read.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from grader.frontends.targets import REPO

PUZZLES = ("p1", "p3", "p4", "p7")  # the puzzles the attack class is graded on
FILES = {"p1": "p1_checkpointing.py", "p3": "p3_data_parallel.py", "p4": "p4_tensor_parallel.py",
         "p7": "p7_overlap.py"}


def solution(pid: str) -> str:
    return (REPO / "solutions" / FILES[pid]).read_text()


def naive(pid: str) -> str:
    return (REPO / "tests" / "naive" / FILES[pid]).read_text()


def stub(pid: str) -> str:
    return (REPO / "puzzles" / FILES[pid]).read_text()


def in_function(source: str, function: str, code: str) -> str:
    """`source` with `code` run first thing in `function` (indented as its body)."""
    head = f"def {function}("
    start = source.index(head)
    colon = source.index(":\n", start) + 2
    body = "".join(f"    {line}\n" for line in code.strip().splitlines())
    return source[:colon] + body + source[colon:]


# A learner who has read the grader names no module off the list of what a puzzle may import in an import statement
# (the grader reads them before loading the file: puzzles/simulator/modules.py) and never writes `__import__`: it
# reaches the import through a builtin's `__self__`. Every attack here is handed in so (evade).
IMP = "getattr(print.__self__, '__imp' + 'ort__')"
_IMPORT_LINE = re.compile(r"^(\s*)import ([\w., ]+?)\s*(#.*)?$")


def evade(source: str) -> str:
    """`source` with every import statement of a module off the list, and every `__import__(`, made through IMP."""
    from puzzles.simulator.modules import allowed_module

    out = []
    for line in source.split("\n"):
        m = _IMPORT_LINE.match(line)
        parts = [p.strip().partition(" as ") for p in m.group(2).split(",")] if m else []
        if m and not all(allowed_module(name.strip()) for name, _, _ in parts):
            line = m.group(1) + "; ".join(
                f"{alias.strip()} = {IMP}({name.strip()!r}, fromlist=['_'])" if alias.strip()
                else f"{name.strip().split('.')[0]} = {IMP}({name.strip()!r})" for name, _, alias in parts)
        out.append(line)
    return "\n".join(out).replace("__import__(", IMP + "(")


def comm_marker(marker: str) -> str:
    """Code that names this process `marker` (as /proc/PID/comm shows it), so a test can find a survivor."""
    return (f"_ct = __import__('ct' + 'ypes')\n_ct.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)\n")


# The rank's rules refuse a thread, a process, ctypes or a file written, where the rank's code asks (allowed.py,
# escapes.py). The sandbox is what holds when those rules are lifted by a learner who has read the grader: the
# attacks on the sandbox lift them first, as that learner would (tests/test_batch_sandbox.py shows one that does
# not, refused by the rules alone).
LIFT_THE_RULES = '''
_allowed = __import__("puzzles.simulator.allowed", fromlist=["_"])  # (computed: the internals scan would refuse it)
_allowed.uninstall()
__import__("puzzles.simulator.escapes", fromlist=["_"]).HANDLERS.clear()
'''

LIFT_THE_THREAD_RULE = '''
__import__("puzzles.simulator.allowed", fromlist=["_"]).uninstall()  # (the threads' rule alone)
'''


def daemon(marker: str, body: str) -> str:
    """A double-forked, setsid'd grandchild that runs `body` and then sleeps; the importing process goes on."""
    lines = "\n".join(f"            {line}" for line in body.strip().splitlines())
    return evade(LIFT_THE_RULES + f'''
import os as _os, time as _time
if _os.fork() == 0:
    _os.setsid()
    if _os.fork() == 0:
        try:
            _ct = __import__('ct' + 'ypes')  # (a computed name: the grader's scan for internals would refuse it)
            _ct.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)
{lines}
        finally:
            _time.sleep(600)
    _os._exit(0)
''')


def killer(marker: str) -> str:
    """A double-forked, setsid'd daemon that kills the puzzle's warden and the worker's zygote (it can where the
    learner's code runs as the batch's own uid: `process` mode), then sleeps: orphaned past both, it must still
    die with the batch (the batch's parent is a subreaper)."""
    return evade(LIFT_THE_RULES + f'''
import os as _os, time as _time
def _parent_of(pid):
    try:
        with open(f"/proc/{{pid}}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return 0
_warden = _parent_of(_os.getpid())
_zygote = _parent_of(_warden) if _warden > 1 else 0
if _os.fork() == 0:
    _os.setsid()
    if _os.fork() == 0:
        try:
            _ct = __import__('ct' + 'ypes')
            _ct.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)
            for _pid in (_warden, _zygote):
                if _pid > 1:
                    try:
                        _os.kill(_pid, 9)
                    except OSError:
                        pass
        finally:
            _time.sleep(600)
    _os._exit(0)
_time.sleep(1)  # (the daemon's work is done before this puzzle goes on)
''')


def attack_class(subs: Path, results: list[Path], marker: str) -> dict[str, dict[str, str]]:
    """{submission: {puzzle: source}}; write_class hands in the reference solution for a puzzle left out where the
    submission is one of the WITNESSES (it must still pass)."""
    grader_root = str(REPO)
    read_others = f'''
import glob as _glob, os as _os, shutil as _sh
_seen = []
for _place in [{str(subs)!r}, _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))]:
    for _victim in ("alice", "bob"):
        _p = _os.path.join(_place, _victim)
        if _os.path.isdir(_p):
            _seen.append(_p + ": " + ",".join(sorted(_os.listdir(_p))))
            _sh.rmtree(_p, ignore_errors=True)
for _p in _glob.glob("/tmp/grader-batch-*/*/*.py"):  # the parent's private copies
    _seen.append(_p)
    _os.remove(_p)
if _seen:
    raise RuntimeError("ATTACK SAW " + repr(_seen))
'''
    find_solutions = f'''
import glob as _glob, os as _os, sys as _sys
_il = __import__('imp' + 'ortlib')  # computed names: the grader's scan for internals would refuse these files
_cands = [{grader_root + "/solutions/p3_data_parallel.py"!r}, "/work/main/solutions/p3_data_parallel.py"]
_cands += [_os.path.join(p, "solutions", "p3_data_parallel.py") for p in _sys.path if p]
for _pattern in ("/*/solutions/p3_*.py", "/*/*/solutions/p3_*.py", "/*/*/*/solutions/p3_*.py"):
    _cands += _glob.glob(_pattern)
try:
    _g = __import__('gra' + 'der')
    _cands.append(_os.path.join(_os.path.dirname(_os.path.dirname(_g.__file__)), "solutions", "p3_data_parallel.py"))
    _cands.append(_il.import_module("solutions.p3_data_parallel").__file__)
except Exception:
    pass
_found = [c for c in _cands if c and _os.path.isfile(c)]
if _found:
    exec(open(_found[0]).read())
else:
    def data_parallel_step(dist, x_shard, target_shard, layers, lr):
        raise RuntimeError("ATTACK FOUND NO SOLUTIONS")
'''
    decoy = results[0].parent / "grade-decoy"
    forge = LIFT_THE_RULES + f'''
import os as _os, torch as _torch
_forged = {{"p3": {{"status": "pass"}}, "status": "observed"}}
for _path in [{str(decoy / "observations.pt")!r}, "/tmp/grade-x/observations.pt"]:
    try:
        _os.makedirs(_os.path.dirname(_path), exist_ok=True)
        _torch.save(_forged, _path)
    except OSError:
        pass
'''
    rewrite = "\n".join(f"for _i in range(3000):\n    _time.sleep(0.05)\n    try:\n        open({str(p)!r}, 'w').write"
                        f"('submission,passed\\nmallory,8\\n')\n    except OSError:\n        pass" for p in results[:1])
    exec_daemon = (f"_os.execv(__import__('sys').executable, [__import__('sys').executable, '-c', "
                   f"'import time; time.sleep(600)  # {marker}-exec'])")
    ledger = '''
_memory = __import__("puzzles.simulator.memory", fromlist=["_"])  # computed: the internals scan would refuse it
_real = _memory.Ledger.allocate
def _allocate(self, key, nbytes, site):
    return _real(self, key, min(nbytes, 8), site)
_memory.Ledger.allocate = _allocate
'''
    cost = '''
_p7 = __import__("grader.specs.p7_overlap.spec", fromlist=["_"])
object.__setattr__(_p7.COST, "bytes_per_tick", None)
object.__setattr__(_p7.COST, "latency_ticks", 0)
'''
    grading = '''
_grading = __import__("grader.core.grading", fromlist=["_"])
_specs = __import__("grader.specs", fromlist=["_"])
_PR = __import__("grader.core.result", fromlist=["_"]).PuzzleResult
_grading.grade_observation = lambda spec, obs, inputs: _PR(spec.id, spec.name, spec.title, "pass")
_specs.SPECS["p3"].check = lambda obs, ref, inputs: []
'''
    observe = '''
_bs = __import__("grader.backends.simulator", fromlist=["_"])
_real_observe = _bs.observe_module
def _forged_observe(spec, module, inputs, seed):
    return _real_observe(spec, module, inputs, seed)
_bs.observe_module = _forged_observe
'''
    world = '''
# (sim.current_ledger() hands out a copy; the ledger itself is reached through the simulator's internals, by name)
_ledger = __import__("puzzles.simulator.world", fromlist=["_"]).calling_rank_ledger()
_ledger.peak = 8
'''
    fake = "\\x1b[2K\\r[9/9] alice: 8 passed, 0 failed, 0 errors, 0 not attempted (FAKE-PROGRESS)\\x1b[31m"
    # Forgers: each rewrites its own record as it leaves the process (every event's times halved, the makespan
    # made consistent), or makes the comparison read 0, from the import on, naming no grader internal.
    halve = '''
def _halve(obs):
    for e in obs["events"]:
        e["start"] //= 2
        e["end"] //= 2
    obs["makespan"] = max((e["end"] for e in obs["events"]), default=0)
'''
    os_write = halve + '''
import json as _json, os as _os
_real_write = _os.write
def _write(fd, data):
    b = bytes(data)
    if b[:8] == b"GRADREC1":  # the record: decode the header, halve, encode again
        n = int.from_bytes(b[8:16], "big")
        head = _json.loads(b[16:16 + n])
        pairs = dict((k, v) for k, v in head["value"]["m"])
        if isinstance(pairs.get("observation"), dict):
            obs = {k: v for k, v in pairs["observation"]["m"]}
            obs["events"] = [{k: v for k, v in e["m"]} for e in obs["events"]]
            _halve(obs)
            obs["events"] = [{"m": [[k, v] for k, v in e.items()]} for e in obs["events"]]
            pairs["observation"] = {"m": [[k, v] for k, v in obs.items()]}
            head["value"] = {"m": [[k, v] for k, v in pairs.items()]}
        new = _json.dumps(head).encode()
        _real_write(fd, b[:8] + len(new).to_bytes(8, "big") + new + b[16 + n:])
        return len(b)
    return _real_write(fd, data)
_os.write = _write
'''
    profile = halve + '''
import sys as _sys
def _hook(frame, event, arg):  # sees every call; rewrites the record it is handed on its way out
    if event == "call" and frame.f_code.co_name in ("dumps", "record_bytes"):
        value = frame.f_locals.get("value", frame.f_locals.get("record"))
        if isinstance(value, dict) and isinstance(value.get("observation"), dict):
            _halve(value["observation"])
getattr(_sys, "set" + "profile")(_hook)
'''
    kernel = '''
import torch as _torch
_lib = _torch.library.Library("aten", "IMPL")
_lib.impl("max", lambda t: _torch.zeros((), dtype=t.dtype), "CPU")  # every max the comparison takes reads 0
'''
    record_grader_error = '''
import json as _json, os as _os
_head = _json.dumps({"value": {"m": [["status", "grader_error"], ["findings", []],
                                     ["error", "the grader crashed, not your answer's fault"]]}, "sizes": []}).encode()
for _fd in _os.listdir("/proc/self/fd"):
    try:
        if _os.readlink(f"/proc/self/fd/{_fd}").startswith("pipe:") and int(_fd) > 2:
            _os.write(int(_fd), b"GRADREC1" + len(_head).to_bytes(8, "big") + _head)
    except OSError:
        pass
_os._exit(0)
'''
    attacks = {
        "alice": {},
        "bob": {p: naive(p) for p in PUZZLES},
        "mallory_delete": {"p1": read_others + solution("p1")},
        "mallory_solutions": {"p3": find_solutions},
        "mallory_forge": {"p3": forge + stub("p3")},
        "mallory_daemon": {"p4": daemon(marker, rewrite) + daemon(marker, exec_daemon) + solution("p4")},
        "mallory_stderr": {"p1": daemon(marker, "pass") + solution("p1")},
        "exit_import": {"p1": "import sys\nsys.exit(0)\n" + solution("p1")},
        "exit_rank": {"p3": in_function(solution("p3"), "data_parallel_step",
                                        "if dist.get_rank() == 1:\n    import sys\n    sys.exit(0)"),
                      "p4": in_function(solution("p4"), "tp_forward", "import os\nos._exit(0)")},
        "looper": {"p3": in_function(solution("p3"), "data_parallel_step", "while True:\n    pass")},
        "hog": {"p3": in_function(solution("p3"), "data_parallel_step",
                                  "import torch\nhog = torch.empty(2**36, dtype=torch.float64)"),
                "p4": in_function(solution("p4"), "tp_forward", "hog = [bytes(1 << 30) for _ in range(64)]")},
        # (each hog asks for its memory at once, without touching it: a hog that filled 64 MiB at a time had not
        # reached its limit within 10 s on a busy machine)
        "liar": {"p1": f"import sys\nprint('{fake}', file=sys.stderr, flush=True)\nprint('{fake}', flush=True)\n"
                       "raise ValueError('\\x1b[2Jcleared your screen')\n"},
        "env_reader": {"p3": "import os\nraise RuntimeError('ENV ' + ' '.join(sorted(os.environ)))\n"},
        "tamper_checks": {"p3": grading + stub("p3").replace("raise NotImplementedError", "return layers  # ")},
        "tamper_ledger": {"p1": ledger + naive("p1")},
        "tamper_cost": {"p7": cost + naive("p7")},
        "tamper_observe": {"p3": observe + naive("p3")},
        "forger": {"p7": os_write + naive("p7"), "p3": profile + naive("p3"), "p4": kernel + naive("p4"),
                   "p1": record_grader_error + naive("p1")},
        "exit70": {"p1": "import os\nos._exit(70)\n" + solution("p1")},
        "lingerer": {"p3": LIFT_THE_THREAD_RULE + "import threading\n"
                           "threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
                           + solution("p3")},  # a thread alive as the record is made could rewrite it
        "starter": {"p3": "import threading\nthreading.Thread(target=threading.Event().wait, daemon=True).start()\n"
                          + solution("p3")},  # the same thread, the rules not lifted: refused where it starts
        "tempfile_user": {"p3": "import tempfile\nwith tempfile.TemporaryDirectory() as _d, "
                                "tempfile.NamedTemporaryFile(dir=_d) as _f:\n    _f.write(b'scratch')\n"
                                + solution("p3")},
        "tamper_world": {"p1": naive("p1") + "\n_real_backward = checkpointed_backward\n\n\n"
                         "def checkpointed_backward(saved, layers, k, grad_y):\n"
                         "    grads = _real_backward(saved, layers, k, grad_y)\n"
                         + "".join(f"    {line}\n" for line in world.strip().splitlines()) + "    return grads\n"},
    }
    return {name: {pid: evade(source) for pid, source in files.items()} for name, files in attacks.items()}


# The submissions whose tests assert that an attack costs its own puzzle only: they hand in the reference solution
# for every puzzle they do not attack, which must still pass. The others hand in their attacks alone (the rest is
# "not handed in", which costs the batch no grading): half the gradings of handing in all four everywhere.
WITNESSES = ("alice", "exit_import", "exit_rank", "looper", "hog", "starter")


def write_class(subs: Path, results: list[Path], marker: str) -> dict[str, dict[str, str]]:
    attacks = attack_class(subs, results, marker)
    for name, files in attacks.items():
        folder = subs / name
        folder.mkdir(parents=True)
        for pid in PUZZLES:
            if pid in files or name in WITNESSES:
                (folder / FILES[pid]).write_text(files.get(pid, solution(pid)))
    return attacks


def survivors(marker: str) -> list[str]:
    """Processes alive now that a submission started: every process an attack starts carries the marker, in its
    name (/proc/PID/comm) or its command line. (Not "every process of a sandbox uid": on a shared machine another
    batch's puzzles run as those uids too.)"""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or entry.name == str(os.getpid()):
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            uid = int(next(line.split()[1] for line in (entry / "status").read_text().splitlines()
                           if line.startswith("Uid:")))
        except (OSError, StopIteration):
            continue
        if comm.startswith(marker[:15]) or marker in cmdline:
            found.append(f"{entry.name} uid {uid} {comm}: {cmdline[:120]}")
    return found
