"""p18 mistake: each rank's file holds its shard and a copy of the small state every rank has alike (the
generator, the order, the numbers); a LATEST file, replaced by an atomic rename, names the newest committed
checkpoint. Correct on resume, but every rank writes what one rank should: the replicated state N times."""

import io
import zlib

import torch

MISTAKE = "the replicated state (generator, order, numbers) written by every rank, not once"
EXPECTED_FAILURES = {"bytes written"}
DIAGNOSIS = "what every rank holds alike is written once, with the manifest"


def to_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def save_checkpoint(dist, fs, state):
    rank, world = dist.get_rank(), dist.get_world_size()
    here = f"c/{state.step}"
    fs.makedirs(here, exist_ok=True)  # every rank: exist_ok makes the race harmless
    data = to_bytes({"shard": torch.cat([state.master, state.m, state.v]), "world": world,
                     "numbers": [state.step, state.adam_steps, state.scale, state.good_steps, state.lr_step,
                                 state.position], "order": state.order, "rng": state.generator.get_state()})
    with fs.open(f"{here}/r{rank}.tmp", "wb") as f:
        f.write(data)
    fs.rename(f"{here}/r{rank}.tmp", f"{here}/r{rank}")
    sums = torch.zeros(world, dtype=torch.int64)
    sums[rank] = zlib.crc32(data)
    dist.all_reduce(sums)
    if rank == 0:
        with fs.open(f"{here}/sums.tmp", "wb") as f:
            f.write(to_bytes(sums))
        fs.rename(f"{here}/sums.tmp", f"{here}/sums")
        with fs.open("c/LATEST.tmp", "wb") as f:
            f.write(str(state.step).encode())
        fs.rename("c/LATEST.tmp", "c/LATEST")


def load_checkpoint(dist, fs, state):
    rank, world = dist.get_rank(), dist.get_world_size()
    if not fs.exists("c/LATEST"):
        return
    with fs.open("c/LATEST", "rb") as f:
        newest = int(f.read().decode())
    steps = sorted((int(n) for n in fs.listdir("c") if n.isdigit() and int(n) <= newest), reverse=True)
    for step in steps:
        good = fs.exists(f"c/{step}/sums")
        if good:
            with fs.open(f"c/{step}/sums", "rb") as f:
                sums = torch.load(io.BytesIO(f.read()), weights_only=True)
            old = sums.numel()
            each = 3 * state.master.numel() * world // old  # master, m, v of one saved shard, side by side
            per = state.master.numel()
            lo, hi = rank * per, (rank + 1) * per
            need = range(lo * old // (per * world), (hi * old - 1) // (per * world) + 1)
            files = {}
            for i in need:
                with fs.open(f"c/{step}/r{i}", "rb") as f:
                    data = f.read()
                good = good and zlib.crc32(data) == int(sums[i])
                files[i] = torch.load(io.BytesIO(data), weights_only=True) if good else None
        flag = torch.tensor([1.0 if good else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if flag.item() < 1:
            continue
        third = each // 3
        first = min(files) * third
        for k, key in enumerate(("master", "m", "v")):
            whole = torch.cat([files[i]["shard"][k * third:(k + 1) * third] for i in sorted(files)])
            setattr(state, key, whole[lo - first:hi - first].clone())
        mine = files[min(files)]
        (state.step, state.adam_steps, state.scale, state.good_steps, state.lr_step,
         state.position) = mine["numbers"]
        state.order = mine["order"]
        state.generator.set_state(mine["rng"])
        state.refresh_layers(dist)
        return
