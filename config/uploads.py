"""Upload sizes: a request body larger than any form takes is refused from its Content-Length,
before a byte of it is read, and sizes are worded in units a person reads ("1.2 MB").

Django reads a body only up to its Content-Length (a body without one reads as empty), so
checking that header bounds what the web process reads, spools to disk or holds in memory.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

# Room for a form's other fields and the multipart framing around its one file.
FORM_SLACK_BYTES = 64 * 1024


def size_text(size: int) -> str:
    """'812 bytes', '640 kB', '1.2 MB': decimal units to one decimal place."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{round(size / scale, 1):g} {unit}"
    return f"{size:,} bytes"


def over_limit_text(size: int, limit: int) -> str:
    """'the file is 1.2 MB; a file may be 1 MB at most' with no '1 MB is over 1 MB'."""
    said = size_text(size)
    if said == size_text(limit):
        said = f"more than {said}"
    return f"the file is {said}; a file may be {size_text(limit)} at most"


class RequestSizeMiddleware:
    """Refuses (413) a body larger than settings.UPLOAD_MAX_BYTES plus the form's slack from its
    Content-Length, before the CSRF check or a view parses it. First in MIDDLEWARE."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0  # Django reads such a body as empty
        limit = settings.UPLOAD_MAX_BYTES
        if length > limit + FORM_SLACK_BYTES:
            return HttpResponse(
                f"Upload refused: {over_limit_text(length, limit)}. Nothing was read or "
                "imported; go back and choose a smaller file.",
                status=413,
                content_type="text/plain; charset=utf-8",
                headers={"Connection": "close"},
            )
        return self.get_response(request)
