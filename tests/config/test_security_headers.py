"""CSP, Permissions-Policy and Cache-Control on real pages; hostile paths and presets are 4xx."""

from __future__ import annotations

import pytest
from django.urls import reverse

from labs.models import LabRun
from tests.labs.factories import make_heartbeat, make_run
from tests.quiz.factories import make_card

pytestmark = pytest.mark.django_db


def _csp(response) -> dict[str, str]:
    policy = response["Content-Security-Policy"]
    return {part.split()[0]: part.strip() for part in policy.split(";") if part.strip()}


@pytest.mark.parametrize("name", ["home", "login", "signup"])
def test_every_page_gets_a_strict_csp_and_a_permissions_policy(client, name):
    response = client.get(reverse(name))
    csp = _csp(response)
    for directive in ("script-src", "style-src", "img-src", "default-src"):
        assert csp[directive] == f"{directive} 'self'", csp
    assert "unsafe-inline" not in response["Content-Security-Policy"]
    assert "camera=()" in response["Permissions-Policy"]
    if name == "home":  # nothing on the anonymous front page is private
        assert "no-store" not in response.get("Cache-Control", "")


@pytest.mark.parametrize(
    "url",
    [
        reverse("quiz:today"),
        reverse("quiz:stats"),
        reverse("quiz:settings-edit"),
        reverse("labs:index"),
        reverse("labs:lab-detail", args=["paged-kv"]),
    ],
)
def test_logged_in_pages_are_private_and_not_stored(alice_client, url):
    make_card()
    response = alice_client.get(url)
    assert response.status_code == 200
    cache = {p.strip() for p in response["Cache-Control"].split(",")}
    assert {"private", "no-store"} <= cache
    assert "Content-Security-Policy" in response


def test_pages_have_no_inline_script_style_or_handler(alice_client):
    import re

    make_card("choice")
    for url in (
        reverse("quiz:today"),
        reverse("quiz:stats"),
        reverse("labs:lab-detail", args=["paged-kv"]),
    ):
        html = alice_client.get(url).content.decode()
        for script in re.findall(r"<script\b[^>]*>", html):
            assert "src=" in script or 'type="application/json"' in script, script
        assert "<style" not in html and " style=" not in html
        assert not re.search(r"\son[a-z]+=", html), url


@pytest.mark.parametrize("kind", ["answer-submit", "review-grade"])
def test_a_nul_in_a_quiz_token_path_is_404(alice_client, kind):
    url = reverse(f"quiz:{kind}", args=["abc"]).replace("abc", "ab%00c")
    assert alice_client.post(url, {"rating": "3"}).status_code == 404


def test_a_preset_that_is_not_a_preset_is_refused_before_the_database(alice_client, settings):
    make_heartbeat("sim")
    url = reverse("labs:run-create", args=["paged-kv"])
    for preset in ("../../admin", "bad\x00preset", "x" * 500):
        response = alice_client.post(url, {"backend": "sim", "preset": preset})
        assert response.status_code == 400, preset
        assert "preset must be the slug of a lab preset" in response.content.decode()
    assert not LabRun.objects.exists()


def test_a_run_saved_with_a_bad_preset_still_shows(alice_client, alice):
    run = make_run(alice, preset="../../admin")
    response = alice_client.get(reverse("labs:run-detail", args=[run.pk]))
    assert response.status_code == 200
    assert "../../admin" not in response.content.decode()


def test_a_nul_in_a_lab_query_or_preset_is_not_a_server_error(alice_client):
    url = reverse("labs:lab-detail", args=["paged-kv"])
    assert alice_client.get(url, {"preset": "a\x00b", "block_size": "1\x00"}).status_code < 500
    assert alice_client.get(reverse("labs:preset-open", args=["a\x00b"])).status_code == 404
