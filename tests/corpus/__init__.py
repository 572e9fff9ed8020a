"""The differential corpus: small rank programs, each run on the simulator and on gloo processes, with the
relation between the two runs written next to it (case.py says what the relations are).

    case.py        the Case record, the @case decorator and the relations
    runner.py      running a case on each backend, the record of gloo's outcomes, judging the two runs
    collectives.py every collective, reduce op and dtype, sync and async
    aliasing.py    outputs that are (views of) inputs, inputs that are slots of outputs, buffers in flight
    layouts.py     non-contiguous tensors, and the output shapes each collective takes
    reduce_ops.py  reduce ops and dtypes that torch refuses
    p2p.py         send/recv, isend/irecv, batch_isend_irecv, tags, src=None, mismatched buffers, deadlocks
    handles.py     work handles waited for, waited for twice, dropped, polled
    groups.py      sub-groups from new_group, members and non-members
    errors.py      mismatched collectives, ranks that return early or raise, threads
    autograd.py    collectives on tensors that require grad (gloo refuses the gathers and reduce-scatter)
    all_to_all.py  all_to_all_single (even, uneven, counts then rows) and all_to_all, and what gloo refuses
    gloo_results.json  what gloo did with each case (python bench/bench_corpus.py --write records it)

Every case function is module-level, so that each gloo process imports it by name. tests/test_sim_corpus.py
holds the simulator to the recorded gloo outcomes on every run; tests/test_corpus_gloo.py runs gloo itself.
bench/CORPUS.md is the table of every case and what each backend did.
"""
