import pytest

from config.throttle import account_key, client_ip
from tests.conftest import make_user

XFF = "HTTP_X_FORWARDED_FOR"


@pytest.mark.parametrize(
    ("header", "proxies", "meta", "expected"),
    [
        # No header configured: the peer's address.
        ("", ["10.0.0.9"], {"REMOTE_ADDR": "10.0.0.9", "HTTP_X_REAL_IP": "1.2.3.4"}, "10.0.0.9"),
        (
            "X-Real-IP",
            ["10.0.0.9"],
            {"REMOTE_ADDR": "10.0.0.9", "HTTP_X_REAL_IP": "1.2.3.4"},
            "1.2.3.4",
        ),
        (
            "HTTP_X_REAL_IP",
            ["10.0.0.0/8"],
            {"REMOTE_ADDR": "10.0.0.9", "HTTP_X_REAL_IP": "1.2.3.4"},
            "1.2.3.4",
        ),
        # A client that reaches gunicorn directly writes the header itself: not believed.
        (
            "X-Real-IP",
            ["127.0.0.1"],
            {"REMOTE_ADDR": "6.6.6.6", "HTTP_X_REAL_IP": "1.2.3.4"},
            "6.6.6.6",
        ),
        ("X-Forwarded-For", [], {"REMOTE_ADDR": "10.0.0.9", XFF: "1.2.3.4"}, "10.0.0.9"),
        # The client writes the first entries of X-Forwarded-For; our proxies append the last.
        (
            "X-Forwarded-For",
            ["10.0.0.9"],
            {"REMOTE_ADDR": "10.0.0.9", XFF: "6.6.6.6, 1.2.3.4"},
            "1.2.3.4",
        ),
        # Two proxies of ours: skip both from the right.
        (
            "X-Forwarded-For",
            ["10.0.0.0/8"],
            {"REMOTE_ADDR": "10.0.0.9", XFF: "6.6.6.6, 1.2.3.4, 10.0.0.5"},
            "1.2.3.4",
        ),
        # Garbage where an address should be: the last hop that gave one.
        (
            "X-Forwarded-For",
            ["10.0.0.9"],
            {"REMOTE_ADDR": "10.0.0.9", XFF: "1.2.3.4, <x>"},
            "10.0.0.9",
        ),
        ("X-Forwarded-For", ["::1"], {"REMOTE_ADDR": "::1", XFF: "2001:db8::7"}, "2001:db8::7"),
    ],
)
def test_it_believes_the_address_header_only_from_trusted_proxies(
    settings, rf, header, proxies, meta, expected
):
    settings.CLIENT_IP_HEADER = header
    settings.TRUSTED_PROXIES = proxies
    assert client_ip(rf.get("/", **meta)) == expected


def test_by_default_a_local_proxys_forwarded_header_is_read_and_nobody_elses(rf):
    # The defaults (.env.example): X-Forwarded-For from loopback only.
    assert client_ip(rf.get("/", REMOTE_ADDR="127.0.0.1", **{XFF: "1.2.3.4"})) == "1.2.3.4"
    assert client_ip(rf.get("/", REMOTE_ADDR="5.5.5.5", **{XFF: "1.2.3.4"})) == "5.5.5.5"


@pytest.mark.django_db
def test_every_spelling_that_logs_in_as_an_account_is_that_account():
    user = make_user("victim2")
    for spelling in ("victim2", " victim2", "victim2 ", "ｖictim2", "ｖｉｃｔｉｍ２", "Victim2"):
        assert account_key(spelling) == f"user:{user.pk}", spelling
    assert account_key("nobody") == "name:nobody"
    # No usable name: nothing to count per account (the form refuses it before any hash).
    for bad in ("", "   ", "a\x00b", "x" * 400):
        assert account_key(bad) == ""
