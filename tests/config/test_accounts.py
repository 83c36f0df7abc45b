import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_it_signs_up_and_logs_in(client):
    response = client.post(
        reverse("signup"),
        {
            "username": "carol",
            "password1": "a-long-passphrase-1",
            "password2": "a-long-passphrase-1",
        },
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("quiz:today")
    assert get_user_model().objects.filter(username="carol").exists()
    assert client.get(reverse("quiz:today")).status_code == 200


def test_it_rejects_a_bad_signup_with_a_message_and_no_user(client):
    response = client.post(
        reverse("signup"), {"username": "carol", "password1": "short", "password2": "other"}
    )
    assert response.status_code == 400
    assert b"The two password fields" in response.content
    assert not get_user_model().objects.filter(username="carol").exists()


@pytest.mark.parametrize("name", ["quiz:today", "quiz:stats", "labs:index"])
def test_learner_pages_need_a_login(client, name):
    response = client.get(reverse(name))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_admin_needs_staff(client, alice):
    client.force_login(alice)
    response = client.get(reverse("admin:index"))
    assert response.status_code == 302
    alice.is_staff = True
    alice.save()
    assert client.get(reverse("admin:index")).status_code == 200


def test_nav_shows_admin_only_to_staff(client, alice):
    client.force_login(alice)
    assert b'href="/admin/"' not in client.get(reverse("quiz:today")).content
    alice.is_staff = True
    alice.save()
    assert b'href="/admin/"' in client.get(reverse("quiz:today")).content


def test_logout_is_a_post_and_password_change_works(client, alice):
    client.force_login(alice)
    response = client.post(
        reverse("password_change"),
        {
            "old_password": "a-long-passphrase-1",
            "new_password1": "another-long-passphrase-2",
            "new_password2": "another-long-passphrase-2",
        },
    )
    assert response.status_code == 302
    alice.refresh_from_db()
    assert alice.check_password("another-long-passphrase-2")
    assert client.post(reverse("logout")).status_code == 302
    assert client.get(reverse("quiz:today")).status_code == 302


def test_htmx_requests_carry_the_csrf_token(client, alice):
    client.force_login(alice)
    html = client.get(reverse("quiz:today")).content.decode()
    assert 'hx-headers=\'{"X-CSRFToken": "' in html
    assert "vendor/htmx-2.0.11.min.js" in html


def test_an_htmx_request_after_logout_sends_the_whole_page_to_login(client):
    response = client.get(reverse("quiz:today"), headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert response["HX-Redirect"].startswith(reverse("login"))
    # A normal request still gets the plain redirect.
    assert client.get(reverse("quiz:today"))["Location"].startswith(reverse("login"))
