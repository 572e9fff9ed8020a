"""Predicting a training step at a published size: the simulator run on meta tensors with a cluster's costs.

    runner.py     predict(config) -> Prediction: one replica simulated, the data-parallel all-reduce by formula
    fast_meta.py  meta kernels that remember the shapes they returned (torch's Python ones are slow)
"""
