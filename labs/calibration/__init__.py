"""Calibrating one device on its own vLLM engine: the job and its sweep.

Owns: calibrating one device on its own vLLM engine: the job a staff member or a worker starts, its
Celery task (`jobs`, task name stable), and the short sweep it runs and fits (`sweep`). The
published calibration the simulator replays is labs.sim's; the fitted constants are
labs.parameters.device_calibration's.

May import: `labs.parameters`, `labs.prediction`, `labs.measurement`, `labs.sim`, `labs.backends`,
`labs.models`, `labs.runs` (and its own modules; tests/test_imports.py enforces it).
"""
