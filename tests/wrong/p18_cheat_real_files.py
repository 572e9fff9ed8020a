"""p18 cheat (found blind): the bulk of the state goes to real files in the temporary folder through builtin
open(), and only small files to the checkpoint disk: the bytes-written budget is an upper bound, and the answer
passed on both backends. A rank's own code may no longer write files (the checkpoint disk's calls come through the
grader's code).
Before any of that, since issue 29's list of modules, the file is refused where it imports os
(puzzles/simulator/modules.py): it is not graded. The rule above still holds by itself ("for writing",
tests/test_sim_threads.py, test_allowed_leaving_torch.py, test_sim_filesystem.py)."""

import io
import os
import tempfile
import zlib

import torch

MISTAKE = "the checkpoint written to real files, not to the checkpoint disk"
EXPECTED_STATUS = "error"
DIAGNOSIS = "imports os"

ROOT = "checkpoints"
STORE = "realfile"


def _store():
    if not hasattr(zlib, "_ckpt_stash"):
        zlib._ckpt_stash = {}
    return zlib._ckpt_stash


def _put(key, data):
    if STORE == "memory":
        _store()[key] = data
    else:
        with open(os.path.join(tempfile.gettempdir(), f"p18_stash_{key[0]}_{key[1]}.bin"), "wb") as f:
            f.write(data)


def _get(key):
    if STORE == "memory":
        return _store().get(key)
    try:
        with open(os.path.join(tempfile.gettempdir(), f"p18_stash_{key[0]}_{key[1]}.bin"), "rb") as f:
            return f.read()
    except OSError:
        return None


def _bytes(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def save_checkpoint(dist, fs, state):
    rank, world = dist.get_rank(), dist.get_world_size()
    folder = f"{ROOT}/step_{state.step:06d}"
    fs.makedirs(folder, exist_ok=True)
    data = _bytes({"master": state.master, "m": state.m, "v": state.v})
    _put((state.step, rank), data)
    crc = zlib.crc32(data)
    small = _bytes(torch.tensor([crc] * 64, dtype=torch.int64))  # the file the damage check will flip
    with fs.open(f"{folder}/shard_{rank}.pt.tmp", "wb") as f:
        f.write(small)
    fs.rename(f"{folder}/shard_{rank}.pt.tmp", f"{folder}/shard_{rank}.pt")
    table = torch.zeros(world, dtype=torch.int64)
    table[rank] = zlib.crc32(small)
    dist.all_reduce(table)
    if rank == 0:
        man = {"step": state.step, "world": world, "table": table, "adam_steps": state.adam_steps,
               "scale": state.scale, "good_steps": state.good_steps, "lr_step": state.lr_step,
               "position": state.position, "generator": state.generator.get_state(), "order": state.order}
        with fs.open(f"{folder}/manifest.pt.tmp", "wb") as f:
            f.write(_bytes(man))
        fs.rename(f"{folder}/manifest.pt.tmp", f"{folder}/manifest.pt")


def _try(fs, folder, step, rank, world):
    try:
        man = torch.load(io.BytesIO(fs.open(f"{folder}/manifest.pt", "rb").read()), weights_only=True)
        per = man["world"] // world
        parts = []
        for j in range(rank * per, (rank + 1) * per):
            small = fs.open(f"{folder}/shard_{j}.pt", "rb").read()
            if zlib.crc32(small) != int(man["table"][j]):
                return None
            data = _get((step, j))
            if data is None or zlib.crc32(data) != int(torch.load(io.BytesIO(small), weights_only=True)[0]):
                return None
            d = torch.load(io.BytesIO(data), weights_only=True)
            parts.append(torch.stack([d["master"], d["m"], d["v"]]))
        return man, torch.cat(parts, dim=1)
    except Exception:
        return None


def load_checkpoint(dist, fs, state):
    rank, world = dist.get_rank(), dist.get_world_size()
    if not fs.exists(ROOT):
        return
    for name in reversed(fs.listdir(ROOT)):
        got = _try(fs, f"{ROOT}/{name}", int(name.split("_")[1]), rank, world)
        bad = torch.tensor([0 if got else 1], dtype=torch.int64)
        dist.all_reduce(bad)
        if int(bad):
            continue
        man, shard = got
        state.step = man["step"]
        state.master, state.m, state.v = (t.clone() for t in shard)
        state.adam_steps, state.scale, state.good_steps = man["adam_steps"], man["scale"], man["good_steps"]
        state.lr_step, state.position, state.order = man["lr_step"], man["position"], man["order"]
        state.generator.set_state(man["generator"])
        state.refresh_layers(dist)
        return
