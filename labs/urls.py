from django.urls import path

from labs import views

app_name = "labs"
urlpatterns = [
    path("", views.index, name="index"),
]
