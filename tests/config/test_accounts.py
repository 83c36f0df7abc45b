import functools
import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import MD5PasswordHasher
from django.test import Client
from django.urls import reverse

from tests.conftest import make_user
from tests.threads import race

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
    with mock.patch("django.contrib.auth.backends.ModelBackend.authenticate") as authenticate:
        # From the attacker's address even the right password waits ...
        response = _login(client, "alice", "a-long-passphrase-1")
        assert response.status_code == 429
        assert "Too many failed log-ins for this account" in response.content.decode()
        assert int(response["Retry-After"]) > 0
        # ... and from another address for a while, as the account's failures just went on.
        response = _login(client, "alice", "a-long-passphrase-1", ip="10.0.0.2")
        assert response.status_code == 429
        assert "failed just now" in response.content.decode()
    authenticate.assert_not_called()
    # Another account from the same address is not affected.
    make_user("bob")
    assert _login(client, "bob", "a-long-passphrase-1").status_code == 302


@pytest.fixture
def fast_hash(fresh_throttle):
    # MD5 hashes in microseconds: these tests make dozens of attempts. Users made after this.
    fresh_throttle.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    return fresh_throttle


def test_admin_login_is_throttled_like_the_sites(client, fast_hash):
    from unittest import mock

    make_user("boss", is_staff=True)
    for _ in range(3):
        response = client.post(
            "/admin/login/", {"username": "boss", "password": "wrong"}, REMOTE_ADDR="10.0.0.1"
        )
        assert response.status_code == 200
    with mock.patch("django.contrib.auth.backends.ModelBackend.authenticate") as authenticate:
        response = client.post(
            "/admin/login/",
            {"username": "boss", "password": "a-long-passphrase-1"},
            REMOTE_ADDR="10.0.0.1",
        )
    authenticate.assert_not_called()
    assert response.status_code == 429 and int(response["Retry-After"]) > 0
    html = response.content.decode()
    assert "Too many failed log-ins for this account" in html
    assert 'name="password"' in html  # the admin's own form, to try again later
    # The failures counted at the admin's door count at the site's too: one account.
    assert _login(client, "boss", "a-long-passphrase-1").status_code == 429


def test_every_spelling_of_a_name_counts_as_one_account(client, fast_hash):
    make_user("victim2")
    # Each of these logs in as victim2 (the form strips and NFKC-normalises the name) ...
    assert _login(client, " ｖictim2 ", "a-long-passphrase-1", ip="10.0.0.50").status_code == 302
    client.logout()
    # ... so their failures are victim2's, whichever spelling and address they come from.
    spellings = ["victim2", " victim2", "ｖictim2", "victim2\t", "VICTIM2"]
    for spelling in spellings[:3]:
        assert _login(client, spelling, "wrong").status_code == 200
    response = _login(client, spellings[3], "a-long-passphrase-1")
    assert response.status_code == 429
    assert "for this account from your address" in response.content.decode()
    # A rotating attacker: after the account's failures a new address waits, whatever spelling.
    fast_hash.LOGIN_FAILURES_PER_ACCOUNT = 3
    response = _login(client, spellings[4], "wrong", ip="10.0.0.99")
    assert response.status_code == 429
    assert "failed just now" in response.content.decode()


def test_the_owner_logs_in_from_their_address_while_an_attacker_is_throttled(client, fast_hash):
    fast_hash.LOGIN_FAILURES_PER_ACCOUNT_CEILING = 10
    fast_hash.LOGIN_ACCOUNT_DELAY_S = 0  # the attacker waits out every delay
    make_user("victim")
    assert _login(client, "victim", "a-long-passphrase-1", ip="192.0.2.10").status_code == 302
    client.logout()
    # Guesses from rotating addresses, a few from each, until the account's ceiling.
    statuses = [
        _login(client, "victim", f"guess{i}", ip=f"10.6.{i // 2}.1").status_code for i in range(14)
    ]
    assert statuses[:10] == [200] * 10 and statuses[10:] == [429] * 4
    # A new address is refused even with the right password ...
    response = _login(client, "victim", "a-long-passphrase-1", ip="10.6.99.1")
    assert response.status_code == 429
    assert "from an address you have logged in from before" in response.content.decode()
    # ... the owner, from their own address, is not.
    assert _login(client, "victim", "a-long-passphrase-1", ip="192.0.2.10").status_code == 302


def test_successful_logins_count_toward_hash_fairness(client, fast_hash):
    fast_hash.LOGINS_PER_ACCOUNT_PER_MIN = 4
    make_user("busy")
    make_user("other")
    for _ in range(4):
        assert _login(client, "busy", "a-long-passphrase-1").status_code == 302
        client.logout()
    response = _login(client, "busy", "a-long-passphrase-1")
    assert response.status_code == 429
    assert "logged in many times in the last minute" in response.content.decode()
    assert _login(client, "other", "a-long-passphrase-1").status_code == 302


def test_attempts_per_address_are_capped_whether_they_succeed_or_not(client, fast_hash):
    fast_hash.LOGIN_ATTEMPTS_PER_IP_PER_MIN = 3
    for name in ("a1", "a2", "a3", "a4"):
        make_user(name)
    for name in ("a1", "a2", "a3"):
        assert _login(client, name, "a-long-passphrase-1").status_code == 302
        client.logout()
    response = _login(client, "a4", "a-long-passphrase-1")
    assert response.status_code == 429 and "Too many log-ins from your address" in (
        response.content.decode()
    )


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


def _change_password(client, old, ip="10.0.0.1", url="/accounts/password/"):
    new = "another-long-passphrase-2"
    data = {"old_password": old, "new_password1": new, "new_password2": new}
    return client.post(url, data, REMOTE_ADDR=ip)


@pytest.mark.parametrize("url", ["/accounts/password/", "/admin/password_change/"])
def test_wrong_old_passwords_on_the_password_change_form_are_throttled(client, fast_hash, url):
    # It was not throttled: 27 of 27 wrong old passwords from 8 threads were hashed.
    from unittest import mock

    user = make_user("changer", is_staff=True)
    client.force_login(user)
    for _ in range(3):
        response = _change_password(client, "wrong", url=url)
        assert response.status_code == 200
        assert "old password was entered incorrectly" in response.content.decode()
    with mock.patch("django.contrib.auth.base_user.AbstractBaseUser.check_password") as checked:
        response = _change_password(client, "a-long-passphrase-1", url=url)
        assert response.status_code == 429 and int(response["Retry-After"]) > 0
        html = response.content.decode()
        assert "Too many failed password checks for this account from your address" in html
        assert 'name="old_password"' in html
        # The same account's failures: its log-in from this address waits too.
        client.logout()
        assert _login(client, "changer", "a-long-passphrase-1").status_code == 429
    checked.assert_not_called()
    user.refresh_from_db()
    assert user.check_password("a-long-passphrase-1")


def test_a_password_change_waits_for_the_log_ins_hash_slots(client, fast_hash):
    from config import throttle

    fast_hash.LOGIN_HASH_WAIT_S = 0.01
    client.force_login(make_user("changer"))
    with throttle._hash_slots:  # a log-in is hashing
        response = _change_password(client, "a-long-passphrase-1")
    assert response.status_code == 503 and response["Retry-After"] == "2"
    assert "Many people are logging in right now" in response.content.decode()
    assert _change_password(client, "a-long-passphrase-1").status_code == 302


# Long enough that a busy machine's thread wake-ups (tens of ms) are small beside it.
HASH_S = 0.2


class SlowHasher(MD5PasswordHasher):
    """MD5 that takes as long as a real hash would hold its slot (sleeping, not spinning)."""

    algorithm = "slow_md5"

    def encode(self, password, salt):
        time.sleep(HASH_S)
        return super().encode(password, salt)


def test_a_freed_hash_slot_goes_to_a_trusted_log_in_before_earlier_guesses():
    """The order the rotating-address test below depends on, without its timing: guesses that
    queued first still wait while a log-in of a higher tier waits."""
    from config import throttle

    slots = throttle._Slots(1)
    assert slots.acquire(throttle.LOWEST_TIER, None)  # another thread is hashing
    order: list[str] = []

    def take(tier, name):
        assert slots.acquire(tier, 60)  # a limit for a busy machine, not a speed check
        order.append(name)
        slots.release()

    def wait_until(check):
        deadline = time.monotonic() + 60
        while not check():
            assert time.monotonic() < deadline
            time.sleep(0.01)

    guesses = [
        threading.Thread(target=take, args=(throttle.LOWEST_TIER, f"guess-{i}")) for i in range(3)
    ]
    for thread in guesses:
        thread.start()
    wait_until(lambda: slots._waiting[throttle.LOWEST_TIER] == 3)
    learner = threading.Thread(target=take, args=(0, "learner"))
    learner.start()
    wait_until(lambda: slots._waiting[0] == 1)
    slots.release()
    for thread in [*guesses, learner]:
        thread.join(60)
    assert order[0] == "learner" and sorted(order[1:]) == ["guess-0", "guess-1", "guess-2"]


# Six attacking threads against one slot, timed: `make test-deep` (the order it relies on is
# checked without timing above).
@pytest.mark.deep
@pytest.mark.django_db(transaction=True)
def test_a_learner_logs_in_during_a_rotating_address_attack(fresh_throttle, monkeypatch):
    # Wrong passwords for random names, a new address every 10 tries, kept a learner out 11
    # times of 11 ("Many people are logging in right now"): every guess queued for the slot.
    from config import throttle

    fresh_throttle.PASSWORD_HASHERS = [f"{__name__}.SlowHasher"]
    fresh_throttle.LOGIN_HASH_WAIT_S = 4 * HASH_S  # four guesses' hashes
    monkeypatch.setattr(throttle, "_hash_slots", throttle._Slots(1))
    make_user("learner")
    stop = threading.Event()

    def attack(n):
        client, tries = Client(), 0
        while not stop.is_set():
            _login(client, f"random-{n}-{tries}", "wrong", ip=f"10.77.{n}.{tries // 10}")
            tries += 1
        return tries

    def learner():
        time.sleep(2 * HASH_S)  # the attack is under way
        client, statuses = Client(), []
        for i in range(5):
            statuses.append(
                _login(client, "learner", "a-long-passphrase-1", ip=f"192.0.2.{i}").status_code
            )
            client.logout()
        stop.set()
        return statuses

    *tries, statuses = race(*[functools.partial(attack, n) for n in range(6)], learner)
    assert statuses == [302] * 5
    assert sum(tries) >= 12  # the attack was hashing all along (two guesses a thread at least)


# --- A spray of real account names from rotating addresses (issue 61) ----------------------------


def _spray(client, names, rounds, first_address=0):
    """Wrong passwords for `names`, each try from an address of its own; the statuses."""
    statuses = []
    for i in range(rounds):
        for n, name in enumerate(names):
            ip = f"10.61.{first_address + i}.{n + 1}"
            statuses.append(_login(client, name, "wrong", ip=ip).status_code)
    return statuses


@pytest.fixture
def spray_throttle(fast_hash):
    fast_hash.LOGIN_ACCOUNT_DELAY_S = 0  # the sprayer waits out every delay
    fast_hash.LOGIN_FAILURES_PER_ACCOUNT_CEILING = 1000
    fast_hash.LOGIN_SUSPECT_CHECKS_PER_MIN = 6
    return fast_hash


def test_a_spray_of_real_names_is_capped_site_wide_but_not_a_learner_on_a_new_address(
    client, spray_throttle
):
    victims = [make_user(f"victim{i}").username for i in range(3)]
    make_user("learner")
    # Three failures per account (LOGIN_FAILURES_PER_ACCOUNT) mark it attacked; after them every
    # try from a fresh address counts against the site's six a minute, then is refused unhashed.
    statuses = _spray(client, victims, 6)
    assert statuses[:9] == [200] * 9
    assert statuses[9:15] == [200] * 6 and set(statuses[15:]) == {429}
    # A learner whose account nobody attacks, on an address it never used: in, at once.
    assert _login(client, "learner", "a-long-passphrase-1", ip="198.51.100.7").status_code == 302


def test_the_owner_of_a_sprayed_account_is_told_what_to_do_and_gets_in_from_home(
    client, spray_throttle
):
    make_user("victim")
    assert _login(client, "victim", "a-long-passphrase-1", ip="192.0.2.10").status_code == 302
    client.logout()
    _spray(client, ["victim"], 12)
    response = _login(client, "victim", "a-long-passphrase-1", ip="198.51.100.8")
    assert response.status_code == 429 and int(response["Retry-After"]) > 0
    page = response.content.decode()
    assert "from an address you have logged in from before" in page
    assert "your password still works from a network you have used" in page
    assert _login(client, "victim", "a-long-passphrase-1", ip="192.0.2.10").status_code == 302


def test_a_spray_at_an_attacked_account_waits_behind_a_learner_for_the_hash(fresh_throttle):
    from config import throttle

    victim, learner = make_user("victim"), make_user("learner")
    for i in range(fresh_throttle.LOGIN_FAILURES_PER_ACCOUNT):
        throttle.login_record(
            throttle.LoginAttempt(ip=f"10.62.0.{i}", account=f"user:{victim.pk}"),
            succeeded=False,
        )
    fresh = "203.0.113.5"
    # Before, both were tier 1 ("no failure from this address"): the spray queued level with
    # the learner and the learner's wait ran out (1 log-in in 6 refused).
    assert throttle.slot_tier(throttle.LoginAttempt(fresh, f"user:{victim.pk}")) == 2
    assert throttle.slot_tier(throttle.LoginAttempt(fresh, f"user:{learner.pk}")) == 1


# Six threads spraying real names against one hash slot, timed: `make test-deep`.
@pytest.mark.deep
@pytest.mark.django_db(transaction=True)
def test_a_learner_logs_in_during_a_spray_of_real_names(fresh_throttle, monkeypatch):
    # The same spray of real account names, a new address every ten tries, refused a learner
    # on a new address once in six log-ins: every guess hashed at the learner's tier.
    from config import throttle

    fresh_throttle.PASSWORD_HASHERS = [f"{__name__}.SlowHasher"]
    fresh_throttle.LOGIN_HASH_WAIT_S = 4 * HASH_S
    fresh_throttle.LOGIN_ACCOUNT_DELAY_S = 0
    fresh_throttle.LOGIN_FAILURES_PER_ACCOUNT_CEILING = 1000
    monkeypatch.setattr(throttle, "_hash_slots", throttle._Slots(1))
    victim_users = [make_user(f"victim{i}") for i in range(6)]
    victims = [user.username for user in victim_users]
    victim_pks = [user.pk for user in victim_users]
    make_user("learner")
    stop = threading.Event()

    def spray(n):
        client, tries, hashed = Client(), 0, 0
        while not stop.is_set():
            name = victims[(n + tries) % len(victims)]
            status = _login(client, name, "wrong", ip=f"10.78.{n}.{tries // 10}").status_code
            hashed += status == 200
            tries += 1
        return hashed

    def learner():
        try:
            return learn()
        finally:
            stop.set()  # whatever happened, the spray ends

    def learn():
        # The spray is under way: each name has failed once (until then, and while the guesses
        # that queued before that wait, the spray hashes at a learner's tier).
        limit = throttle._limits()["account"]
        deadline = time.monotonic() + 60
        while any(throttle._failures(limit, f"user:{pk}") == 0 for pk in victim_pks):
            assert time.monotonic() < deadline
            time.sleep(HASH_S / 4)
        time.sleep(len(victims) * HASH_S)
        client, statuses = Client(), []
        for i in range(6):
            statuses.append(
                _login(client, "learner", "a-long-passphrase-1", ip=f"192.0.2.{i}").status_code
            )
            client.logout()
        return statuses

    started = time.monotonic()
    *hashed, statuses = race(*[functools.partial(spray, n) for n in range(6)], learner)
    minutes = (time.monotonic() - started) / 60
    print(f"spray of real names: {sum(hashed)} guesses hashed in {minutes * 60:.1f} s")
    assert statuses == [302] * 6
    # Hashed guesses: each account's first LOGIN_FAILURES_PER_ACCOUNT, then the site's cap.
    cap = fresh_throttle.LOGIN_SUSPECT_CHECKS_PER_MIN
    assert sum(hashed) <= len(victims) * fresh_throttle.LOGIN_FAILURES_PER_ACCOUNT + cap + 6
