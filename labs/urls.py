from django.urls import path

from labs import question_views, views

app_name = "labs"
urlpatterns = [
    path("", views.index, name="index"),
    path("preset/<str:slug>/", views.preset_open, name="preset-open"),
    path("runs/", views.run_list, name="run-list"),
    path("runs/compare/", views.run_compare, name="run-compare"),
    path("runs/<int:pk>/", views.run_detail, name="run-detail"),
    path("runs/<int:pk>/cancel/", views.run_cancel, name="run-cancel"),
    path("sweeps/<int:pk>/", views.sweep_detail, name="sweep-detail"),
    path("sweeps/<int:pk>/cancel/", views.sweep_cancel, name="sweep-cancel"),
    path("devices/", views.devices, name="devices"),
    path("devices/calibrate/", views.device_calibrate, name="device-calibrate"),
    path("instincts/", question_views.instincts, name="instincts"),
    # Lab slugs last: "runs", "sweeps", "preset", "devices" and "instincts" above are not labs.
    path("<slug:lab>/", views.lab_detail, name="lab-detail"),
    path("<slug:lab>/predict/", views.lab_predict, name="lab-predict"),
    path("<slug:lab>/runs/", views.run_create, name="run-create"),
    path("<slug:lab>/sweeps/", views.sweep_create, name="sweep-create"),
    path(
        "<slug:lab>/questions/<slug:slug>/", question_views.question_detail, name="question-detail"
    ),
    path("<slug:lab>/questions/<slug:slug>/run/", question_views.question_run, name="question-run"),
]
