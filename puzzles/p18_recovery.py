# Generated from solutions/p18_recovery.py by `python -m grader build`: fill in the code marked NotImplementedError, then run `python -m grader`. (stub digest 5e129b5f1550)
"""Puzzle 18 — Recovery: a sharded checkpoint, a failure, an exact resume.

The task: write `save_checkpoint(dist, fs, state)` and `load_checkpoint(dist, fs, state)` for a job of 4 ranks
that trains with ZeRO-sharded Adam in mixed precision (puzzles 8 and 9). The grader runs the job, kills it,
starts it again from the disk, on 4 ranks and then on 2, and checks (Ψ = 8,192 weights, N = 4 ranks):
  - exact resume: saving changes nothing, and after rank 2 dies at the start of step 5, four fresh ranks load the
    newest checkpoint: every piece of the state below is bit for bit what the run without a failure had after
    step 4, on every rank, and steps 5 and 6 end bit for bit where that run ends;
  - crash points: the job dies at every change a rank makes to the disk while it saves step 4 (the reference
    makes 11: 5 on rank 0, 2 on each other rank), a file half written, a rename or a removal not yet done; after
    each, four fresh ranks load a whole checkpoint (step 2 or step 4), bit for bit, and train on exactly;
  - damaged checkpoint: one byte flipped in the middle of the largest file rank 2 wrote in the save of step 4 (its
    shard), after the save (a torn write after a power loss, a bad sector): load_checkpoint falls back to step 2,
    on every rank;
  - bytes written, in each save: every rank its own shard of master, m and v (float32, 12 bytes a weight) and
    nothing of another's, at most 12·Ψ/N + F = 24,576 + 4,096 = 28,672 bytes; one rank besides writes what every
    rank holds alike (the generator's 5,056 bytes, the order's 768: G = 5,824) and the manifest, at most
    12·Ψ/N + G + 2·F = 24,576 + 5,824 + 8,192 = 38,592 bytes. F = 4 KiB is a file's torch.save framing (about 2 KB)
    and room for the manifest's numbers. The float16 weights are not written (they are the masters rounded). The
    reference writes 26,529 bytes on ranks 1-3 and 34,374 on rank 0 (its shard and the manifest), with torch
    2.13's framing;
  - reshard 4 to 2: two fresh ranks load step 4 from the 4 ranks' files: rank q holds elements q·Ψ/2 to
    (q+1)·Ψ/2 - 1 of master, m and v (the saved shards 2q and 2q+1), the rest as saved; steps 5 and 6 end bit for
    bit where the grader's own run on 2 ranks from that state ends.

A job that trains for weeks on thousands of GPUs loses a machine every few hours. It survives by writing
checkpoints and, when a process dies, starting again from the last good one, often on fewer machines than before.
"Good" means three things: it holds every piece of state the training depends on (miss one and the resumed run
quietly drifts from the one that never failed); it is whole (a job dies in the middle of a save as easily as
anywhere else); and it is the newest one that is whole.

The state (`state`, a TrainingState: grader/specs/p18_recovery/training.py runs the step), per rank:

    state.step          int     steps run so far (the loop saves after steps 2 and 4, and stops after 6)
    state.master        float32 [Ψ/N]  this rank's shard of the flat master weights, elements r·Ψ/N to
                        (r+1)·Ψ/N - 1 of w1, w2, w1, w2 flattened in order
    state.m, state.v    float32 [Ψ/N]  Adam's moments, the same shard
    state.adam_steps    int     Adam's t: the steps taken (a step skipped at an overflow is not counted)
    state.scale         float   the loss scale; state.good_steps: good steps in a row since it last changed
    state.lr_step       int     the learning-rate schedule's own counter (torch's LRScheduler.last_epoch)
    state.generator     torch.Generator, the same on every rank: dropout masks, and each epoch's order
    state.order         int64 [96]  this epoch's order of the 96 samples; state.position: the next one's index
    state.layers        [(w1, w2), (w1, w2)] float16, the same on every rank: the master weights rounded, which
                        the forward runs on. Not saved: state.refresh_layers(dist) rebuilds them from the masters
                        (every rank calls it: an all-gather), as the step does after each update.

Everything but the shards is the same on every rank. Each epoch (3 steps of 32 samples) holds one sample whose
targets are 10,000 times larger: its step overflows float16, is skipped, and halves the scale, so Adam's count,
the scale and the loop's step each tell their own story. Miss the generator and the dropout masks change; miss the
order or the position and the next batch holds other samples; miss the scale and the step after differs.

The disk (`fs`), shared by every rank and by every launch of the job, with the calls a real program makes:

    fs.open(path, "wb"), "rb"     f.write(bytes), f.read(); torch.save(obj, f), torch.load(f) take such a file
    fs.rename(src, dst)           atomic (os.replace): dst is the old file or the new one, never a mix
    fs.makedirs(path, exist_ok=False), fs.exists(path), fs.listdir(path) (sorted), fs.getsize(path),
    fs.remove(path), fs.rmtree(path)
                                  paths are relative ("checkpoints/step_000004/shard_0.pt"); a folder must exist
                                  before a file goes in it

When a process dies, what it handed to write() is on the disk (the operating system has it), a write() under way
leaves the first part of its bytes, a rename is done or not done, and everything else it held is gone. So:

    a file written in place        can be found half written, and the old one it replaced is lost
    written as x.tmp, renamed      x is absent or whole, and the old x stays until the rename
    a folder of files              is whole only once every file in it is: a manifest written last says so

A checkpoint on the disk, as the reference writes it:

    checkpoints/step_000002/                a folder per save: the last good one is never touched
        shard_0.pt ... shard_3.pt           rank r: its shard of master, m, v (torch.save of a dict), 26,529 bytes
        manifest.pt                         one rank, last: the step, the world size, each shard's checksum and
                                            size, and the replicated state: 7,845 bytes
    checkpoints/step_000004/
        shard_0.pt.tmp  --rename-->  shard_0.pt        each file written under a temporary name, renamed once whole
        ...
        manifest.pt.tmp --rename-->  manifest.pt       the commit: written after every shard is on the disk

The job, launch by launch (S: save_checkpoint, L: load_checkpoint, X: a rank dies):

    train      1 2 S 3 4 S 5 6          4 ranks, the run without a failure (saving must change nothing)
    crash      1 2 S 3 4 S X            rank 2 dies as step 5 begins; the disk keeps what it had
      resume                 L 5 6      4 fresh ranks on that disk: load step 4, the newest
      reshard                L 5 6      2 fresh ranks on it: the same checkpoint, cut in 2 shards
    damaged                  L 3 4 5 6  the train launch's disk, a byte of rank 2's step-4 shard flipped: step 2
    at every change of the save of step 4, on any rank:
               1 2 S 3 4 s.X            the job dies there ...
                             L +1       ... and 4 fresh ranks load a whole checkpoint and run one step

The crash points of the reference's save of step 4 (each rank runs on until it waits for the dead one):

    rank 0   makedirs | write shard_0.pt.tmp | rename | write manifest.pt.tmp | rename (the commit)
    rank 1              write shard_1.pt.tmp | rename
    rank 2, 3           likewise
             A crash anywhere before the commit leaves step 4's folder without a manifest: step 2 is loaded.

Loading, on a fresh process: find the newest checkpoint that is whole (its manifest there, and every shard you
need matching its checksum), with every rank agreeing on the same one (a rank whose shard is damaged must not load
an older step while the others load the newer: agree with an all_reduce). On 2 ranks the manifest's world size
(4) says which saved shards hold a part of rank q's new shard: 2q and 2q+1, joined. Restore every piece, then
rebuild the float16 weights with state.refresh_layers(dist). Leave the state as it is when no checkpoint is whole
(a first launch); never delete the checkpoint before the newest (the damaged check falls back to it).

The disk costs time on the simulated clock, as a program that waits for its disk (the simulator's DISK: 8 bytes a
tick, 8 GB/s, and 1,000 ticks for every call that is not a read or a write): a save of the reference takes 2·1,000 +
26,529/8 = 5,317 ticks on ranks 1-3 and 5·1,000 + 26,529/8 + 7,845/8 = 9,298 on rank 0 (each rounded up), where a
step's backward takes about 210 (the grader's own step is drawn as its backward). No time budget here; it is why
real jobs checkpoint rarely, and asynchronously (torch.distributed.checkpoint's async_save). On real processes
(`--backend torch`) the same job runs on real files in a temporary folder, a process killed by os._exit at the same
points: every figure above is the same there.

Hints:
  - `buf = io.BytesIO(); torch.save(obj, buf); data = buf.getvalue()` gives the bytes of a checkpoint file (write
    them at once), `zlib.crc32(data)` a checksum of them, and `torch.load(io.BytesIO(data), weights_only=True)`
    reads them back (tensors, numbers, strings, lists and dicts).
  - `state.generator.get_state()` is a tensor; `state.generator.set_state(t)` puts it back.
  - Numbers reach another rank as tensors: `dist.all_gather_into_tensor(out, torch.tensor([crc, size]))`.
  - Zero-padded step numbers (`step_000004`) sort as numbers do.
"""

import io
import zlib

import torch


def save_checkpoint(dist, fs, state):
    raise NotImplementedError("p18: write save_checkpoint")


def load_checkpoint(dist, fs, state):
    raise NotImplementedError("p18: write load_checkpoint")
