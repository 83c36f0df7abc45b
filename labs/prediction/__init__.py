"""The closed forms behind every "predicted" figure, by topic: KV memory (`memory`), the time of
a step, a prefill and a speculative token (`steps`), and what a run under the learner's load does
(`load`). `labs.predict` assembles them into the one prediction the pages, the CLI and the cards
show. Standard library and numpy only; never Django, so the simulator can use them too.
"""
