from django.apps import AppConfig


class LabsConfig(AppConfig):
    name = "labs"
    verbose_name = "Labs"

    def ready(self) -> None:
        from labs.questions import services as questions
        from labs.runs import events, turns

        # A prediction waits for its runs: the worker that finishes one grades it.
        events.run_finished.connect(questions.on_run_finished, dispatch_uid="labs-questions")
        # Questions' points are simulated on the lab worker, in turn with the lab runs.
        turns.register(questions.QUESTION_SIMULATIONS)
