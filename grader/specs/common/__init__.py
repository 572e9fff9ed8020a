"""What several puzzles' specs share, and which puzzles use what.

    costs.py             what the model's pieces cost on the clock (a block's forward and backward, the loss, a copy,
                         an elementwise op), measured with sim.tally: p1, p3, p4, p10, p11, p13-p17
    pipeline.py          the pipeline spec (PipelineSpec): stages, inputs, the serial step cut at the stage boundaries,
                         the checks of gradients, stage compute and bubble: p5, p6, p17
    pipeline_values.py   the model cut into p stages, its sizes and costs, and what wrong gradients say about the
                         mistake (a common factor, swapped microbatches, one microbatch's contribution): p5, p6, p16,
                         p17
    pipeline_schedule.py a pipeline's schedule read off its messages and ops (core/schedule.py): each stage's work
                         between the messages that need it, the critical path's floor; the bubble checks of p5,
                         p6, p11, p16, p17 refuse a schedule the clock could not have run
    optimizer_state.py   every tensor an optimizer object keeps, found whatever its style (a skipped step leaves it,
                         the state is float64): p8, p9, p19

Each module here is used by more than one puzzle; a puzzle's own sizes, rules and diagnoses live in its package.
"""
