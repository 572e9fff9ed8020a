"""p18 in another style: every rank writes into a temporary folder (`step_4.incomplete/`), the manifest goes in it
last, and rank 0 commits by renaming the whole folder into place (an atomic rename of a directory). The loader
takes only folders without the suffix, verifies its own shards' checksums, and the ranks agree by an all_reduce."""

import io
import zlib

import torch


def save_checkpoint(dist, fs, state):
    rank, world = dist.get_rank(), dist.get_world_size()
    final = f"run/step_{state.step:03d}"
    work = final + ".incomplete"
    if rank == 0:
        fs.makedirs(work, exist_ok=True)
    dist.barrier()
    buf = io.BytesIO()
    torch.save([state.master, state.m, state.v], buf)
    with fs.open(f"{work}/{rank}.bin", "wb") as f:
        f.write(buf.getvalue())
    sums = torch.zeros(world, dtype=torch.int64)
    sums[rank] = zlib.crc32(buf.getvalue())
    dist.all_reduce(sums)  # every rank's checksum, once every shard is written
    if rank == 0:
        buf = io.BytesIO()
        torch.save({"world": world, "sums": sums, "step": state.step, "adam_steps": state.adam_steps,
                    "scale": state.scale, "good_steps": state.good_steps, "lr_step": state.lr_step,
                    "position": state.position, "order": state.order,
                    "rng": state.generator.get_state()}, buf)
        with fs.open(f"{work}/manifest", "wb") as f:
            f.write(buf.getvalue())
        fs.rename(work, final)  # the commit: the folder appears whole, under its final name


def load_checkpoint(dist, fs, state):
    rank, world = dist.get_rank(), dist.get_world_size()
    done = [n for n in fs.listdir("run") if not n.endswith(".incomplete")] if fs.exists("run") else []
    for name in sorted(done, reverse=True):
        with fs.open(f"run/{name}/manifest", "rb") as f:
            manifest = torch.load(io.BytesIO(f.read()), weights_only=True)
        old = manifest["world"]
        per_old, per_new = state.master.numel() * world // old, state.master.numel()
        lo = rank * per_new
        mine = range(lo // per_old, (lo + per_new - 1) // per_old + 1)
        parts, ok = [], True
        for i in mine:
            with fs.open(f"run/{name}/{i}.bin", "rb") as f:
                data = f.read()
            ok = ok and zlib.crc32(data) == int(manifest["sums"][i])
            parts.append(torch.load(io.BytesIO(data), weights_only=True) if ok else None)
        agreed = torch.tensor([int(ok)])
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        if not agreed.item():
            continue
        start = lo - mine[0] * per_old
        for k, key in enumerate(("master", "m", "v")):
            setattr(state, key, torch.cat([p[k] for p in parts])[start:start + per_new].clone())
        for key in ("step", "adam_steps", "scale", "good_steps", "lr_step", "position", "order"):
            setattr(state, key, manifest[key])
        state.generator.set_state(manifest["rng"])
        state.refresh_layers(dist)
        return
