"""The predictor (`python -m grader predict`): a training step at a published size, run on the simulator on meta
tensors with the costs of real GPUs and their network, and what it says. In the order of the story:

  1. the model and the run
    config.py           the configuration: model, parallelism, recomputation, cluster
    presets.py          the published runs as configurations (Korthikanti et al. 2022, Narayanan et al. 2021,
                        MT-NLG 530B, torchtitan's Llama 3.1 8B)
    published.py        their measured figures, their sources, and the split into a fitting and a held-out set
    tensor_parallel.py  Megatron's column- and row-parallel products, with and without sequence parallelism
    gpt.py              one tensor-parallel rank's slice of Megatron-LM's GPT: layers, embedding, head and loss
    llama.py            torchtitan's Llama 3 step with FSDP
    recompute.py        activation recomputation (selective: the attention's core; full: each layer)
  2. the step on meta tensors
    schedule.py         the pipeline schedules: 1F1B and the interleaved one
    step.py             one replica's training step as the rank program (weights, schedule, optimizer)
    fast_meta.py        meta kernels that remember the shapes they returned (torch's Python ones are slow)
    runner.py           predict(config) -> Prediction: one replica simulated
    lines.py            predict_by_line: the step read off lines through a few shorter runs (fewer stages and
                        microbatches), what keeps every preset to seconds
    data_parallel.py    the data-parallel replicas' all-reduce, bucketed under the backward or after it, by formula
    answers.py          the learner's puzzle answers in the step, where they can run at that size
  3. the devices and the links
    devices.py          real GPUs as device profiles (peak rates, Calculon's efficiency curves and processing mode)
    cluster.py          nodes, NVLink inside a node, InfiniBand between: what a message or a collective costs
    sharing.py          what a collective under compute takes from it (the SMs NCCL uses)
  4. what it says
    formulas.py         the papers' formulas it is held to: activation memory, weights, FLOPs, the bubble
    report.py           the report, its JSON, and the prediction as a result the trace and the plots read

Everything runs on `meta` tensors: the simulator's ledger, clock, FLOPs and bytes are those of the real sizes, and
no value is computed. The simulator (puzzles/) keeps what the puzzles use too (the roofline in cost.py); what only
the predictor needs lives here. Imports puzzles/ and core/; the front ends (frontends/predict.py, the command line,
and frontends/at_scale.py, the notebook's section) import it.
"""
