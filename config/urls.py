from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from config import views

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    # Pages name the icon in <head>; this answers tools that ask for /favicon.ico without looking.
    path("favicon.ico", views.favicon, name="favicon"),
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/login/", views.login, name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/password/", views.password_change, name="password_change"),
    path(
        "accounts/password/done/",
        auth_views.PasswordChangeDoneView.as_view(),
        name="password_change_done",
    ),
    path("quiz/", include("quiz.urls")),
    path("labs/", include("labs.urls")),
    # Before the admin's own URLs, so its log-in and password change are throttled as the site's.
    path("admin/login/", views.admin_login),
    path("admin/password_change/", views.admin_password_change),
    path("admin/", admin.site.urls),
]

handler500 = "config.errors.server_error"
