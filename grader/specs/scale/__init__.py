"""A training step at a published size, for `python -m grader predict`: Megatron-LM's GPT (tensor, sequence and
pipeline parallelism, activation recomputation) as rank programs that run on meta tensors, and the papers'
formulas they are held to.

    config.py           the configuration: model, parallelism, recomputation, cluster
    presets.py          the published runs: Korthikanti et al. 2022's 22B to 1T, torchtitan's Llama 3.1 8B
    tensor_parallel.py  Megatron's column- and row-parallel products, with and without sequence parallelism
    gpt.py              one rank's slice of the GPT: layers, embedding, head and loss
    recompute.py        activation recomputation (selective: the attention's core; full: each layer)
    schedule.py         the pipeline schedules: 1F1B and the interleaved one
    step.py             one replica's training step, the rank program (weights, schedule, optimizer)
    formulas.py         the papers' formulas: activation memory, weights, FLOPs, the bubble

Everything runs on `meta` tensors: the simulator's ledger, clock, FLOPs and bytes are those of the real sizes,
and no value is computed.
"""
