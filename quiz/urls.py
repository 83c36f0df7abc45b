from django.urls import path

from quiz import views

app_name = "quiz"
urlpatterns = [
    path("", views.today, name="today"),
    path("answer/<str:token>/", views.answer_submit, name="answer-submit"),
    path("grade/<str:token>/", views.review_grade, name="review-grade"),
    path("undo/", views.review_undo, name="review-undo"),
    path("cards/<slug:slug>/", views.card_detail, name="card-detail"),
    path("cards/<slug:slug>/unsuspend/", views.card_unsuspend, name="card-unsuspend"),
    path("cards/<slug:slug>/retire/", views.card_retire, name="card-retire"),
    path("from-run/<int:pk>/", views.card_from_run, name="card-from-run"),
    path("from-sweep/<int:pk>/", views.card_from_sweep, name="card-from-sweep"),
    path("stats/", views.stats, name="stats"),
    path("stats/anki/", views.anki_export, name="anki-export"),
    path("settings/", views.settings_edit, name="settings-edit"),
]
