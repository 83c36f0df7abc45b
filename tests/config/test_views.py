"""Project-level pages: the icon every page names."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.test import Client


def test_it_names_an_icon_that_exists_on_every_page(client: Client):
    html = client.get("/accounts/login/").content.decode()
    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in html
    assert (Path(settings.BASE_DIR) / "static" / "favicon.svg").read_text().startswith("<svg")


def test_it_answers_favicon_ico_instead_of_404(client: Client):
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == "/static/favicon.svg"
