from django.apps import AppConfig


class QuizConfig(AppConfig):
    name = "quiz"
    verbose_name = "Quiz"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from quiz import models
        from quiz.selectors import card_cache_clear

        # An edit in the admin shows at once in this process (see quiz.selectors.card_for_quiz).
        for model in (models.Card, models.ChoiceOption, models.CardTag, models.CardRelation):
            for signal in (post_save, post_delete):
                signal.connect(card_cache_clear, sender=model, dispatch_uid=f"card-cache-{model}")
