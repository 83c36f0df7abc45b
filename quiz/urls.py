from django.urls import path, register_converter

from quiz import parameter_views, views


class TokenConverter:
    """A showing's token (secrets.token_urlsafe): anything else, a NUL byte included, is a 404
    before it can reach the database."""

    regex = r"[A-Za-z0-9_-]{1,64}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(TokenConverter, "token")

app_name = "quiz"
urlpatterns = [
    path("", views.today, name="today"),
    path("answer/<token:token>/", views.answer_submit, name="answer-submit"),
    path("grade/<token:token>/", views.review_grade, name="review-grade"),
    path("undo/", views.review_undo, name="review-undo"),
    path("cards/<slug:slug>/", views.card_detail, name="card-detail"),
    path("cards/<slug:slug>/unsuspend/", views.card_unsuspend, name="card-unsuspend"),
    path("cards/<slug:slug>/retire/", views.card_retire, name="card-retire"),
    path("from-run/<int:pk>/", views.card_from_run, name="card-from-run"),
    path("mine/", views.my_cards, name="my-cards"),
    path("from-sweep/<int:pk>/", views.card_from_sweep, name="card-from-sweep"),
    path("stats/", views.stats, name="stats"),
    path("stats/anki/", views.anki_export, name="anki-export"),
    path("settings/", views.settings_edit, name="settings-edit"),
    path("parameters/", parameter_views.parameters_page, name="parameters"),
    path("parameters/optimize/", parameter_views.parameters_optimize, name="parameters-optimize"),
    path("parameters/use/<int:pk>/", parameter_views.parameters_use, name="parameters-use"),
    path("parameters/revert/", parameter_views.parameters_revert, name="parameters-revert"),
]
