"""Puzzle 13 — Collectives from point-to-point: the ring all-reduce and recursive doubling.

The task: write the all-reduce that puzzles 3 to 12 called, twice, with send and recv only (no collective may be
called), in place like `dist.all_reduce(t)`: when your function returns, t on every rank holds the sum of every
rank's t.
  - `ring_all_reduce(dist, t)`: a ring reduce-scatter over N chunks, then a ring all-gather: 2(N-1) steps, each
    sending one chunk S/N to the next rank while receiving one from the previous rank. Best for large tensors.
  - `recursive_doubling_all_reduce(dist, t)`: log2 N rounds; in round k, rank r swaps its whole running sum with
    rank r ^ 2^k (XOR) and adds. Best for small tensors.

The budgets, per run (S = the bytes of t; the grader runs each function at N = 4 and 8 ranks, at S = 4 KiB and
512 KiB, the two sides of the crossover below; the formulas follow):

    run                      bytes each rank      makespan at most, ticks:                memory beyond t
                             sends, exactly       formula + adds + 10% of the formula     at most, bytes
    ring, N=4, 4 KiB              6,144            864 +    18 +    86 =    968                 3,072
    ring, N=4, 512 KiB          786,432         13,056 +   588 + 1,305 = 14,949               263,168
    ring, N=8, 4 KiB              7,168          1,904 +    35 +   190 =  2,129                 2,048
    ring, N=8, 512 KiB          917,504         16,128 +   700 + 1,612 = 18,440               132,096
    doubling, N=4, 4 KiB          8,192            384 +    20 +    38 =    442                 9,216
    doubling, N=4, 512 KiB    1,048,576         16,640 + 1,544 + 1,664 = 19,848             1,049,600
    doubling, N=8, 4 KiB         12,288            576 +    30 +    57 =    663                 9,216
    doubling, N=8, 512 KiB    1,572,864         24,960 + 2,316 + 2,496 = 29,772             1,049,600

The ring (N = 4, t cut into chunks 0..3; a, b, c, d are the four ranks' parts of a chunk):

    reduce-scatter, N-1 steps: send a chunk to the right, receive one from the left, add it into yours
      at the start:   chunk 0      chunk 1      chunk 2      chunk 3
        rank 0        a            a            a            a         every step, rank r sends the chunk it
        rank 1        b            b            b            b         added into in the step before (its own
        rank 2        c            c            c            c         chunk r at step 0) to rank r + 1
        rank 3        d            d            d            d
      after 3 steps:
        rank 0        .            a+b+c+d      .            .         each rank holds one chunk complete:
        rank 1        .            .            a+b+c+d      .         rank r holds chunk (r + 1) mod N
        rank 2        .            .            .            a+b+c+d
        rank 3        a+b+c+d      .            .            .
    all-gather, N-1 more steps: pass the complete chunks on round the ring, each received straight into its place
      in t (nothing to add); after 3 steps every rank holds every chunk complete.

    one step on one rank:   send |== chunk to rank r+1 ==|          both at once: isend and irecv, then wait
                            recv |== chunk from rank r-1 ==|        for both (links are full duplex)
                            add                            |+=|     (reduce-scatter only)

Recursive doubling (N = 8; round k pairs rank r with rank r ^ 2^k):

    round 0:  0<->1  2<->3  4<->5  6<->7    then each rank holds the sum of 2 ranks' tensors
    round 1:  0<->2  1<->3  4<->6  5<->7                                    of 4
    round 2:  0<->4  1<->5  2<->6  3<->7                                    of all 8

The cost model (α = 128 ticks of latency per message; links of 64 bytes per tick, β = 1/64 tick per byte):
  - a message of n bytes takes α + n·β ticks. Links are full duplex: a rank sends to one rank while it receives
    from another, but its own sends go one at a time, as do its receives.
  - compute is the puzzles' GPU: adding a received buffer of m elements into t (t += buf: reads two, writes one)
    takes ⌈3·8·m / 2,048⌉ + 4 ticks on the roofline; views (t.view(-1).chunk(N)) and torch.empty cost nothing.
  - the ring: 2(N-1) steps of one chunk: bytes sent 2(N-1)/N·S (under 2S whatever N), time 2(N-1)(α + S/(Nβ)).
    Recursive doubling: log2 N steps of the whole tensor: bytes log2(N)·S, time log2(N)(α + S/β).
  - the adds: each chunk of the reduce-scatter must be added before it is passed on, so the ring's N-1 adds of a
    chunk lie on its critical path, and doubling's log2 N adds of the whole tensor on its. The makespan budget is
    the α-β formula, plus those adds, plus 10% of the formula (an allocation or a copy per step).

The crossover. The two formulas are equal at

    S* = α/β · (2(N-1) - log2 N) / (log2 N - 2(N-1)/N)
       = 8 α/β = 65,536 bytes (64 KiB) at N = 4;    8.8 α/β = 72,089.6 bytes (about 70 KiB) at N = 8

(α/β = 128·64 = 8,192 bytes). Below S*, doubling's log2 N latencies beat the ring's 2(N-1); above it, the ring's
bandwidth term (2(N-1)/N·S: each rank sends under 2S, however many ranks) beats doubling's log2(N)·S. The adds
move it lower on this clock (doubling adds log2 N whole tensors, the ring N-1 chunks): measured with the
reference, doubling is the faster up to 52 KiB at N = 4 and 61 KiB at N = 8 (bench/COLLECTIVES.md). The runs
graded sit well to either side: 4 KiB and 512 KiB. Meeting both budgets makes doubling the faster at 4 KiB
(its budget, 442 and 663 ticks, is under the ring's formula alone, 864 and 1,904) and the ring the faster at
512 KiB (14,949 and 18,440, under doubling's formula alone, 16,640 and 24,960). Collective libraries choose by
size the same way: MPI's use recursive doubling for short messages and the ring for long ones, NCCL chooses
between its ring and its tree.

How the grader calls your functions: on 8 ranks, eight runs one after the other (a barrier of its own between
them), each function at N = 8 (ranks 0-7) and at N = 4, where ranks 0-3 and ranks 4-7 are two worlds of 4 at once.
`dist` is the world your function runs in: `dist.get_rank()` is 0..N-1 in it, `dist.get_world_size()` is N, and
send, recv, isend, irecv, `dist.P2POp` and `batch_isend_irecv` take its ranks. `t` is a contiguous float64 tensor,
[512] (4 KiB) or [512, 128] (512 KiB); its number of elements is a multiple of N. Return nothing.

Checks (each over the four runs of its function; the message lists every run):
  - ring values, doubling values: t on every rank equals the sum of its world's tensors.
  - no collective: every rank communicates with send and recv (isend, irecv, batch_isend_irecv) only; any
    collective (all_reduce, reduce_scatter_tensor, all_gather_into_tensor, broadcast, barrier, ...) fails it.
  - ring bytes, doubling bytes: the bytes each rank sends in each run are exactly the algorithm's, 2(N-1)/N·S on
    the ring (all of them to its ring neighbours, the next rank or the previous one) and log2(N)·S in recursive
    doubling (the table's figures).
  - ring makespan, doubling makespan: each run, from the barrier before it to its last rank's last op, within the
    α-β formula plus the adds plus 10% (the table's figures).
  - ring memory, doubling memory: the most bytes a rank holds during the call beyond what it held when the call
    began (t was already there), at most two messages' worth and 1 KiB: 2·S/N + 1 KiB on the ring, 2·S + 1 KiB in
    recursive doubling (one receive buffer is all either needs; room for a second, say a new one made before the
    last is freed).
  - a deadlock is an error: here, as on gloo, a blocking send waits until its receive is posted, so a ring in
    which every rank sends first and receives after never moves.
  - keep everything as torch tensors (the grader refuses a tensor turned into a numpy array, a Python list or
    bytes, which its memory ledger could not see).

Hints:
  - `chunks = t.view(-1).chunk(N)` is a tuple of N views of t, each contiguous: adding into one in place changes
    t. Add with `chunks[j].add_(buf)` (a tuple's items cannot be assigned to, so += on one raises a TypeError):

        >>> t = torch.zeros(8, dtype=torch.float64)
        >>> chunks = t.view(-1).chunk(4)             # 4 views of t, 2 elements each
        >>> chunks[1].add_(torch.ones(2, dtype=torch.float64))
        tensor([1., 1.], dtype=torch.float64)
        >>> t                                        # t changed with it
        tensor([0., 0., 1., 1., 0., 0., 0., 0.], dtype=torch.float64)

  - One step: `works = [dist.isend(send_chunk, right), dist.irecv(buf, left)]`, then `for w in works: w.wait()`.
    In the all-gather, receive straight into the chunk of t the message completes.
  - Allocate one receive buffer (torch.empty_like) before the loop and reuse it: torch.empty writes nothing.
"""

import torch


def ring_all_reduce(dist, t):
    # BEGIN SOLUTION
    n, r = dist.get_world_size(), dist.get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    chunks = t.view(-1).chunk(n)  # n views of t, S/N elements each
    buf = torch.empty_like(chunks[0])
    for k in range(n - 1):  # reduce-scatter: after step k, chunk (r - k - 1) holds k + 2 ranks' parts
        works = [dist.isend(chunks[(r - k) % n], right), dist.irecv(buf, left)]
        for w in works:
            w.wait()
        chunks[(r - k - 1) % n].add_(buf)
    for k in range(n - 1):  # all-gather: chunk (r + 1) is complete; pass the complete chunks on, in place
        works = [dist.isend(chunks[(r + 1 - k) % n], right), dist.irecv(chunks[(r - k) % n], left)]
        for w in works:
            w.wait()
    # END SOLUTION


def recursive_doubling_all_reduce(dist, t):
    # BEGIN SOLUTION
    n, r = dist.get_world_size(), dist.get_rank()
    buf = torch.empty_like(t)
    step = 1
    while step < n:  # round k: partner r ^ 2^k; afterwards t holds the sum of 2^(k+1) ranks' tensors
        works = [dist.isend(t, r ^ step), dist.irecv(buf, r ^ step)]
        for w in works:
            w.wait()
        t += buf
        step *= 2
    # END SOLUTION
