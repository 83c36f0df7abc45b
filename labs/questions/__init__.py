"""Lab questions: a figure a learner predicts before a run, graded against what the run measured.

A question (content/labs/questions/<slug>.yaml, loaded into `LabQuestion`) names a lab, the
figure asked (`figures.FIGURES`), the settings it is asked at and the neighbouring settings the
quiz asks next. The learner commits a figure before Run; the run (a pair for a ratio: the
setting and its baseline) grades it within the run's expected error (Good), a factor of 2 (Hard)
or neither (Again) (`bands`). The grade goes to the quiz through `labs.hooks`; the quiz asks
again at a neighbouring setting, graded against a simulation of it stored ahead of time on the
lab worker (`QuestionSimulation`), and reads all this only through `labs.api`.

Modules: `figures` and `spec` and `bands` and `instincts` are plain Python over lab parameters
(no ORM); `models`, `services`, `selectors` and `content` use the database. Nothing here imports
the quiz.

Owns: lab questions: the figure asked, its bands, its content and the learner's predictions

May import: `labs.parameters`, `labs.prediction`, `labs.measurement`, `labs.sim`,
`labs.explanation`, `labs.runs`, `labs.backends`, `labs.models`, `labs.hooks` (and its own modules;
tests/test_imports.py enforces it).
"""
