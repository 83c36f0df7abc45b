from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET


@require_GET
@login_required
def today(request: HttpRequest) -> HttpResponse:
    return render(request, "quiz/today.html", {})


@require_GET
@login_required
def stats(request: HttpRequest) -> HttpResponse:
    return render(request, "quiz/stats.html", {})
