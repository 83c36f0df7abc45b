"""Project-level views: the front door and accounts. Quiz and lab pages live in their apps."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import login as auth_login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm, PasswordChangeForm, UserCreationForm
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.views.decorators.http import require_GET, require_http_methods

from config import throttle

# One answer for a name that is taken and one that is reserved, so the message alone does not
# say an account exists (and sign-ups are throttled per address, so names cannot be listed).
UNAVAILABLE = "That username is not available. Choose another."
RESERVED_USERNAMES = frozenset({"admin", "administrator", "root", "staff", "support", "system"})


class SignupForm(UserCreationForm):
    class Meta(UserCreationForm.Meta):
        error_messages = {"username": {"unique": UNAVAILABLE}}

    def clean_username(self) -> str:
        username = self.cleaned_data.get("username") or ""
        taken = self._meta.model.objects.filter(username__iexact=username).exists()
        if username.lower() in RESERVED_USERNAMES or taken:
            raise forms.ValidationError(UNAVAILABLE, code="unavailable")
        return username


class LoginView(auth_views.LoginView):
    redirect_authenticated_user = True


def _refuse_login(
    request: HttpRequest, reason: Exception, status: int, retry_after_s: int
) -> HttpResponse:
    context = {
        "form": AuthenticationForm(request),
        "throttled": reason,
        "next": str(request.POST.get("next", ""))[:2000],
    }
    response = render(request, "registration/login.html", context, status=status)
    response["Retry-After"] = str(retry_after_s)
    return response


def _refuse_admin_login(
    request: HttpRequest, reason: Exception, status: int, retry_after_s: int
) -> HttpResponse:
    context = {
        **admin.site.each_context(request),
        "title": "Log in",
        "app_path": request.get_full_path(),
        "form": AdminAuthenticationForm(request),
        "throttled": reason,
    }
    response = render(request, "admin/login.html", context, status=status)
    response["Retry-After"] = str(retry_after_s)
    return response


def _refuse_password_change(
    request: HttpRequest, reason: Exception, status: int, retry_after_s: int
) -> HttpResponse:
    context = {"form": PasswordChangeForm(request.user), "throttled": reason}
    response = render(request, "registration/password_change_form.html", context, status=status)
    response["Retry-After"] = str(retry_after_s)
    return response


# Django's log-in and password-change views, throttled before any password is hashed
# (config/throttle.py); hashes wait for one of LOGIN_HASH_CONCURRENCY slots per process.
login = throttle.login_throttled(LoginView.as_view(), _refuse_login)
admin_login = throttle.login_throttled(admin.site.login, _refuse_admin_login)
password_change = login_required(
    throttle.password_change_throttled(
        auth_views.PasswordChangeView.as_view(), _refuse_password_change
    )
)
admin_password_change = admin.site.admin_view(
    throttle.password_change_throttled(admin.site.password_change, _refuse_password_change)
)


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("quiz:today")
    return render(request, "home.html")


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("quiz:today")
    if request.method == "POST":
        # Every sign-up costs a password hash: count them all, and refuse before the form runs.
        limit, ip = throttle.signup_limit(), throttle.client_ip(request)
        try:
            throttle.check(
                limit, ip, "Too many sign-ups from your address. Try again in {minutes} min."
            )
        except throttle.Throttled as exc:
            context = {"form": SignupForm(), "throttled": exc}
            response = render(request, "registration/signup.html", context, status=429)
            response["Retry-After"] = str(exc.retry_after_s)
            return response
        throttle.hit(limit, ip)
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            with throttle.hash_slot():
                user = form.save()
        except throttle.Busy as exc:
            context = {"form": form, "throttled": exc}
            response = render(request, "registration/signup.html", context, status=503)
            response["Retry-After"] = "2"
            return response
        auth_login(request, user, backend="config.backends.ModelBackendWithSettings")
        return redirect("quiz:today")
    status = 400 if request.method == "POST" else 200
    return render(request, "registration/signup.html", {"form": form}, status=status)


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    # Resolved per request: with hashed static names the URL exists only after collectstatic.
    return redirect(static("favicon.svg"), permanent=True)
