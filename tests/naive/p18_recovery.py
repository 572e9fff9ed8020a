"""Naive p18: every rank torch.saves everything it holds (its shard, the float16 weights, the replicated state) to
one file of its own, in place, and loads its own file back. Right as long as nothing goes wrong: a crash in the
middle of a save leaves a half-written file where the last good checkpoint was, every rank writes the weights
again, there is no checksum to refuse a damaged file, and 2 ranks cannot read 4 ranks' files."""

import io

import torch

EXPECTED_FAILURES = {"crash points", "damaged checkpoint", "bytes written", "reshard 4 to 2"}
DIAGNOSIS = "the float16 weights"

NUMBERS = ("step", "adam_steps", "scale", "good_steps", "lr_step", "position")


def save_checkpoint(dist, fs, state):
    fs.makedirs("checkpoint", exist_ok=True)
    everything = {name: getattr(state, name) for name in NUMBERS}
    everything.update(master=state.master, m=state.m, v=state.v, order=state.order,
                      generator=state.generator.get_state(), layers=[w.detach() for pair in state.layers for w in pair])
    with fs.open(f"checkpoint/rank_{dist.get_rank()}.pt", "wb") as f:
        torch.save(everything, f)


def load_checkpoint(dist, fs, state):
    path = f"checkpoint/rank_{dist.get_rank()}.pt"
    if not fs.exists(path):
        return
    with fs.open(path, "rb") as f:
        everything = torch.load(io.BytesIO(f.read()), weights_only=True)
    for name in NUMBERS:
        setattr(state, name, everything[name])
    state.master, state.m, state.v, state.order = everything["master"], everything["m"], everything["v"], \
        everything["order"]
    state.generator.set_state(everything["generator"])
    with torch.no_grad():
        for w, saved in zip([w for pair in state.layers for w in pair], everything["layers"]):
            w.copy_(saved)
