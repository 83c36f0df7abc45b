"""What a finished run means: measured beside predicted, and why they differ.

Owns: what a finished run means to a learner: measured next to predicted (`results`), why they
differ (`explain`, `waterfall`), what held admission back (`limits`), how each number is defined
(`definitions`), the errors to read beside each figure (`accuracy`), ratios between two runs
(`ratios`), a learner's own number for a card (`your_number`), and random settings across the form
checked against the ideal engine (`form_draws`). Reads; never writes a run or queues one.

May import: `labs.parameters`, `labs.prediction`, `labs.measurement`, `labs.sim`, `labs.backends`,
`labs.models` (and its own modules; tests/test_imports.py enforces it).
"""
