"""A lab run's life: submitted, queued in turn, run in a worker, reaped.

Owns: a lab run's life: submitting runs and sweeps (`submission`), the queues and turns
(`queueing`, `turns`), running one in a worker (`execution`), reaping stale ones (`reaping`), their
Celery tasks (`tasks`, names stable), the workers that announce themselves (`workers`), the reads
the lab pages show (`selectors`), the signals labs sends its own parts (`events`), and why a
device's engine is busy, calibration progress included (`busy`).

May import: `labs.parameters`, `labs.prediction`, `labs.measurement`, `labs.sim`,
`labs.explanation`, `labs.backends`, `labs.models`, `labs.hooks` (and its own modules;
tests/test_imports.py enforces it).
"""
