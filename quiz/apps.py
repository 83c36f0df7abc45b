from django.apps import AppConfig


class QuizConfig(AppConfig):
    name = "quiz"
    verbose_name = "Quiz"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from labs import api as labs_api
        from quiz import models
        from quiz.lab_questions import prediction_graded
        from quiz.personal import CARD_REQUESTS, work_in_flight
        from quiz.selectors import card_cache_clear, cards_using_presets, reviews_at_least

        # An edit in the admin shows at once in this process (see quiz.selectors.card_for_quiz).
        for model in (models.Card, models.ChoiceOption, models.CardTag, models.CardRelation):
            for signal in (post_save, post_delete):
                signal.connect(card_cache_clear, sender=model, dispatch_uid=f"card-cache-{model}")
        # What labs asks of the quiz without importing it (labs/hooks.py).
        labs_api.answer_for_labs(
            reviews_at_least=reviews_at_least,
            cards_using=cards_using_presets,
            work_in_flight=work_in_flight,
            queued_work=[CARD_REQUESTS],
            prediction_graded=prediction_graded,
        )
