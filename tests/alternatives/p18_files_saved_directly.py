"""p18 in another style: flat file names (no folders), torch.save straight into the open file, each rank reads its
file back for its checksum, the checksums gathered with the list form of all_gather; the loader reads every shard
of a candidate on every rank, so every rank reaches the same verdict without an all_reduce."""

import io
import zlib

import torch

KEYS = ("step", "adam_steps", "scale", "good_steps", "lr_step", "position")


def save_checkpoint(dist, fs, state):
    rank, world = dist.get_rank(), dist.get_world_size()
    name = f"ckpt-{state.step:04d}-shard-{rank}-of-{world}.pt"
    with fs.open(name + ".partial", "wb") as f:
        torch.save({"master": state.master, "m": state.m, "v": state.v}, f)
    with fs.open(name + ".partial", "rb") as f:
        crc = zlib.crc32(f.read())
    fs.rename(name + ".partial", name)
    crcs = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(crcs, torch.tensor([crc], dtype=torch.int64))
    if rank == 0:
        meta = {key: getattr(state, key) for key in KEYS}
        meta.update(world=world, crcs=[int(c) for c in crcs], order=state.order.clone(),
                    generator=state.generator.get_state())
        with fs.open(f"ckpt-{state.step:04d}.meta.partial", "wb") as f:
            torch.save(meta, f)
        fs.rename(f"ckpt-{state.step:04d}.meta.partial", f"ckpt-{state.step:04d}.meta")


def read(fs, name):
    with fs.open(name, "rb") as f:
        return f.read()


def load_checkpoint(dist, fs, state):
    rank, world = dist.get_rank(), dist.get_world_size()
    steps = sorted((int(n.split("-")[1].split(".")[0]) for n in fs.listdir("") if n.endswith(".meta")), reverse=True)
    for step in steps:
        meta = torch.load(io.BytesIO(read(fs, f"ckpt-{step:04d}.meta")), weights_only=True)
        old = meta["world"]
        names = [f"ckpt-{step:04d}-shard-{i}-of-{old}.pt" for i in range(old)]
        if not all(fs.exists(n) and zlib.crc32(read(fs, n)) == c for n, c in zip(names, meta["crcs"])):
            continue  # every rank read the same files, so every rank skips this one
        shards = [torch.load(io.BytesIO(read(fs, n)), weights_only=True) for n in names]
        for key in ("master", "m", "v"):
            whole = torch.cat([s[key] for s in shards])
            n = whole.numel() // world
            setattr(state, key, whole[rank * n:(rank + 1) * n].clone())
        for key in KEYS:
            setattr(state, key, meta[key])
        state.order = meta["order"]
        state.generator.set_state(meta["generator"])
        state.refresh_layers(dist)
        return
