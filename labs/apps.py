from django.apps import AppConfig


class LabsConfig(AppConfig):
    name = "labs"
    verbose_name = "Labs"

    def ready(self) -> None:
        from labs.questions import services as questions

        # Registers the run tasks in every process, the web's too: a turn is sent by its task's
        # name (labs.runs.queueing), which Celery looks up among the tasks it knows.
        from labs.runs import events, tasks, turns  # noqa: F401

        # A prediction waits for its runs: the worker that finishes one grades it.
        events.run_finished.connect(questions.on_run_finished, dispatch_uid="labs-questions")
        # Questions' points are simulated on the lab worker, in turn with the lab runs.
        turns.register(questions.QUESTION_SIMULATIONS)
