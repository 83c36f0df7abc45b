"""A discrete-event simulator of one vLLM-style engine replica, in virtual time.

Pure Python and numpy; never imports Django (tests/labs/sim/test_purity.py checks it).

    workload.py    requests like `vllm bench serve` (lengths, shared prefix, arrivals)
    entities.py    per-request counters (RequestTable) and a view of one request (SimRequest)
    block_pool.py  KV blocks, grown lazily: free queue, reference counts, prefix-cache map
    kv_cache.py    per-request block tables, paged or contiguous
    rules.py       the scheduling rules, stated once: budget, blocks, admission, sampling
    scheduler.py   applies them a step at a time: running first, FCFS admission, preemption
    engine_model.py  step time and its parts on the realistic or ideal profile (calibration.yaml)
    cost_model.py  the cost-model interface; the ideal one is labs.prediction.predict.step_time_s
    breakdown.py   where each request's time went, charged step by step
    calibration.py the published vLLM runs of calibration.yaml, replayed (and the fit)
    simulator.py   the event loop; returns a RunRecord (labs/backends/base.py)
    recording.py   what a run records as it goes: engine samples, each request's chunks
    decode_run.py  runs of plain decode steps at once, where the rules prove them plain
    steady.py      busy steps taken with a few scalars instead of arrays over the batch
    lab.py         a Simulator built from lab parameters, and a finished run's time breakdown

Owns: the discrete-event simulator of one vLLM-style engine, the scheduling rules (`rules`), the
realistic and ideal engine profiles and the published calibration.

May import: `labs.parameters`, `labs.prediction`, `labs.measurement`, `labs.backends.base` (and its
own modules; tests/test_imports.py enforces it).
"""
