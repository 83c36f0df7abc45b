from django.urls import path

from quiz import views

app_name = "quiz"
urlpatterns = [
    path("", views.today, name="today"),
    path("stats/", views.stats, name="stats"),
]
