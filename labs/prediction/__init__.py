"""The closed forms behind every "predicted" figure, by topic: KV memory (`memory`), the time of a
step, a prefill and a speculative token (`steps`), and what a run under the learner's load does
(`load`). `labs.prediction.predict` assembles them into the one prediction the pages, the CLI and
the cards show. Standard library and numpy only; never Django, so the simulator can use them too.

Owns: the closed forms behind every "predicted" figure: KV memory (`memory`), the time of a step, a
prefill and a speculative token (`steps`), what a run under the learner's load does (`load`), the
one prediction the pages, the CLI and the cards show (`predict`), how big a simulated run is and
whether it fits the budget (`sizing`), and speculation as a calibrated CPU engine runs it
(`device_speculation`). Standard library and numpy only; never Django, so the simulator can use
them too.

May import: `labs.parameters` (and its own modules; tests/test_imports.py enforces it).
"""
