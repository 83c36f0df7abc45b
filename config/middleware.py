"""Project middleware.

HtmxLoginRedirectMiddleware: an expired session during an htmx request sends the whole page to
the login form. Without this, `login_required` answers an htmx request with a 302 that htmx
follows itself, and the login page is swapped into the middle of the quiz card.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import resolve_url
from django.utils.cache import patch_cache_control
from django_htmx.http import HttpResponseClientRedirect


class HtmxLoginRedirectMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            getattr(request, "htmx", False)
            and response.status_code == 302
            and response["Location"].startswith(resolve_url(settings.LOGIN_URL))
        ):
            return HttpResponseClientRedirect(response["Location"])
        return response


class PrivacyHeadersMiddleware:
    """Permissions-Policy on every response; `Cache-Control: private, no-store` on every page
    served to a logged-in learner, so a shared cache or the browser's back button on a shared
    machine does not keep their cards, runs or settings."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.setdefault("Permissions-Policy", settings.PERMISSIONS_POLICY)
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            patch_cache_control(response, private=True, no_store=True)
        return response
