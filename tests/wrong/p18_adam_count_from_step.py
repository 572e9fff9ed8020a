"""p18 mistake: Adam's step count is not saved; the load sets it to the loop's step, but a skipped step is not
counted by Adam."""

import io
import zlib

import torch

MISTAKE = "Adam's step count restored as the loop's step"
EXPECTED_FAILURES = {'damaged checkpoint', 'reshard 4 to 2', 'crash points', 'exact resume'}
DIAGNOSIS = "a step skipped at an overflow is not one of Adam's"


def save_checkpoint(dist, fs, state):
    rank, world = dist.get_rank(), dist.get_world_size()
    folder = f"checkpoints/step_{state.step:06d}"  # a new folder for every save: the last one is never touched
    if rank == 0:
        fs.makedirs(folder, exist_ok=True)
    dist.barrier()  # the folder exists before any rank writes into it
    buffer = io.BytesIO()
    torch.save({"master": state.master, "m": state.m, "v": state.v}, buffer)
    data = buffer.getvalue()
    with fs.open(f"{folder}/shard_{rank}.pt.tmp", "wb") as f:
        f.write(data)
    fs.rename(f"{folder}/shard_{rank}.pt.tmp", f"{folder}/shard_{rank}.pt")  # whole, or not there at all
    mine = torch.tensor([zlib.crc32(data), len(data)], dtype=torch.int64)
    every = torch.empty(2 * world, dtype=torch.int64)
    dist.all_gather_into_tensor(every, mine)  # returns once every rank's shard is on the disk
    if rank == 0:
        manifest = {"step": state.step, "world_size": world, "numel": state.master.numel() * world,
                    "checksums": every.view(world, 2).tolist(), 
                    "scale": state.scale, "good_steps": state.good_steps, "lr_step": state.lr_step,
                    "position": state.position, "order": state.order, "generator": state.generator.get_state()}
        buffer = io.BytesIO()
        torch.save(manifest, buffer)
        with fs.open(f"{folder}/manifest.pt.tmp", "wb") as f:
            f.write(buffer.getvalue())
        fs.rename(f"{folder}/manifest.pt.tmp", f"{folder}/manifest.pt")  # the commit: now it is complete


def load_checkpoint(dist, fs, state):
    rank, world = dist.get_rank(), dist.get_world_size()
    folders = sorted(fs.listdir("checkpoints")) if fs.exists("checkpoints") else []
    for name in reversed(folders):  # the newest first
        folder = f"checkpoints/{name}"
        manifest, shards = None, {}
        if fs.exists(f"{folder}/manifest.pt"):
            with fs.open(f"{folder}/manifest.pt", "rb") as f:
                manifest = torch.load(io.BytesIO(f.read()), weights_only=True)
            size = manifest["numel"] // manifest["world_size"]  # elements in one of the saved shards
            lo, hi = rank * (manifest["numel"] // world), (rank + 1) * (manifest["numel"] // world)
            for i in range(lo // size, (hi - 1) // size + 1):  # the saved shards that hold a part of mine
                with fs.open(f"{folder}/shard_{i}.pt", "rb") as f:
                    data = f.read()
                if [zlib.crc32(data), len(data)] != manifest["checksums"][i]:
                    manifest = None  # damaged: not a checkpoint to load
                    break
                shards[i] = torch.load(io.BytesIO(data), weights_only=True)
        good = torch.tensor([0.0 if manifest is None else 1.0])
        dist.all_reduce(good, op=dist.ReduceOp.MIN)  # every rank loads the same checkpoint, or none does
        if good.item() == 0.0:
            continue
        first = min(shards) * size
        for key in ("master", "m", "v"):
            whole = torch.cat([shards[i][key] for i in sorted(shards)])
            setattr(state, key, whole[lo - first:hi - first].clone())
        for key in ("step", "scale", "good_steps", "lr_step", "position"):
            setattr(state, key, manifest[key])
        state.order = manifest["order"]
        state.adam_steps = manifest["step"]  # but a skipped step is not one of Adam's
        state.generator.set_state(manifest["generator"])
        state.refresh_layers(dist)
        return
