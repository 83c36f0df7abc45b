"""The catalog and the lab parameters: what a lab run is asked to be.

Owns: what a lab run is asked to be: the hardware and model catalogs (`catalog`), every lab setting
with its default, bounds and validation (`params`), the labs and the deck's presets (`presets`),
and one device's fitted constants (`device_calibration`). Plain Python: no Django, no ORM.

May import: nothing else of labs (and its own modules; tests/test_imports.py enforces it).
"""
