import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from tests.conftest import make_user

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


# --- Throttles ------------------------------------------------------------------------------------


@pytest.fixture
def fresh_throttle(settings):
    from django.core.cache import cache

    settings.LOGIN_FAILURES_PER_IP = 20
    settings.LOGIN_FAILURES_PER_ACCOUNT = 3
    settings.SIGNUPS_PER_IP = 2
    cache.clear()
    yield settings
    cache.clear()


def _login(client, username, password, ip="10.0.0.1"):
    return client.post(
        reverse("login"), {"username": username, "password": password}, REMOTE_ADDR=ip
    )


def test_failed_logins_for_one_account_are_throttled_before_hashing(client, alice, fresh_throttle):
    from unittest import mock

    for _ in range(3):
        assert _login(client, "alice", "wrong").status_code == 200
    with mock.patch("django.contrib.auth.hashers.PBKDF2PasswordHasher.encode") as encode:
        # From another address too: the limit is the account's. Even the right password waits.
        response = _login(client, "alice", "a-long-passphrase-1", ip="10.0.0.2")
    assert response.status_code == 429
    assert "Too many failed log-ins for this account" in response.content.decode()
    assert int(response["Retry-After"]) > 0
    encode.assert_not_called()
    # Another account from the same address is not affected.
    make_user("bob")
    assert _login(client, "bob", "a-long-passphrase-1").status_code == 302


def test_failed_logins_from_one_address_are_throttled(client, fresh_throttle):
    fresh_throttle.LOGIN_FAILURES_PER_IP = 4
    for i in range(4):
        assert _login(client, f"nobody{i}", "wrong").status_code == 200
    response = _login(client, "nobody-else", "wrong")
    assert response.status_code == 429
    assert "Too many failed log-ins from your address" in response.content.decode()
    assert _login(client, "nobody-else", "wrong", ip="10.9.9.9").status_code == 200


def test_signups_are_throttled_per_address(client, fresh_throttle):
    for i in range(2):
        data = {"username": f"new{i}", "password1": "x", "password2": "y"}
        assert client.post(reverse("signup"), data, REMOTE_ADDR="10.0.0.7").status_code == 400
    data = {
        "username": "new9",
        "password1": "a-long-passphrase-1",
        "password2": "a-long-passphrase-1",
    }
    response = client.post(reverse("signup"), data, REMOTE_ADDR="10.0.0.7")
    assert response.status_code == 429 and "Too many sign-ups" in response.content.decode()
    assert not get_user_model().objects.filter(username="new9").exists()


def test_signup_does_not_say_that_an_account_exists(client, alice, fresh_throttle):
    taken = {
        "username": "Alice",
        "password1": "a-long-passphrase-9",
        "password2": "a-long-passphrase-9",
    }
    reserved = {**taken, "username": "admin"}
    for data in (taken, reserved):
        html = client.post(reverse("signup"), data).content.decode()
        assert "That username is not available" in html
        assert "already exists" not in html


def test_a_down_cache_lets_logins_through(client, alice, fresh_throttle):
    from unittest import mock

    with mock.patch("config.throttle.cache") as cache:
        cache.get.side_effect = ConnectionError("redis down")
        cache.add.side_effect = ConnectionError("redis down")
        assert _login(client, "alice", "wrong").status_code == 200
        assert _login(client, "alice", "a-long-passphrase-1").status_code == 302


def test_a_login_that_finds_every_hash_slot_taken_is_told_to_retry_at_once(
    client, alice, fresh_throttle
):
    from config import throttle

    fresh_throttle.LOGIN_HASH_WAIT_S = 0.01
    with throttle._hash_slots:  # another thread is hashing
        response = _login(client, "alice", "a-long-passphrase-1")
    assert response.status_code == 503 and response["Retry-After"] == "2"
    assert "Many people are logging in right now" in response.content.decode()
    assert _login(client, "alice", "a-long-passphrase-1").status_code == 302


@pytest.mark.parametrize(
    ("header", "meta", "expected"),
    [
        ("", {"REMOTE_ADDR": "10.0.0.9", "HTTP_X_REAL_IP": "1.2.3.4"}, "10.0.0.9"),
        ("X-Real-IP", {"REMOTE_ADDR": "10.0.0.9", "HTTP_X_REAL_IP": "1.2.3.4"}, "1.2.3.4"),
        ("HTTP_X_REAL_IP", {"REMOTE_ADDR": "10.0.0.9", "HTTP_X_REAL_IP": "1.2.3.4"}, "1.2.3.4"),
        # The client writes the first entries of X-Forwarded-For; the proxy appends the last.
        (
            "X-Forwarded-For",
            {"REMOTE_ADDR": "10.0.0.9", "HTTP_X_FORWARDED_FOR": "6.6.6.6, 1.2.3.4"},
            "1.2.3.4",
        ),
    ],
)
def test_it_reads_the_client_address_from_the_header_as_configured(
    settings, rf, header, meta, expected
):
    from config.throttle import client_ip

    settings.CLIENT_IP_HEADER = header
    assert client_ip(rf.get("/", **meta)) == expected
