"""The authentication backend loads a session's user with the quiz settings (config/backends.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from config.backends import ModelBackendWithSettings
from quiz import selectors, services
from quiz.models import LearnerSettings

pytestmark = pytest.mark.django_db
User = get_user_model()


def _settings_queries(user) -> tuple[LearnerSettings, int]:
    with CaptureQueriesContext(connection) as queries:
        found = selectors.learner_settings_get(user=user)
    return found, len(queries)


def test_the_session_user_brings_its_settings_in_the_same_query(alice):
    LearnerSettings.objects.create(user=alice, time_zone="Asia/Tokyo", new_per_day=7)
    with CaptureQueriesContext(connection) as queries:
        user = ModelBackendWithSettings().get_user(alice.pk)
    assert len(queries) == 1
    found, n = _settings_queries(user)
    assert n == 0 and (found.time_zone, found.new_per_day) == ("Asia/Tokyo", 7)
    # Django's own backend leaves them for a second query.
    found, n = _settings_queries(ModelBackend().get_user(alice.pk))
    assert n == 1 and found.time_zone == "Asia/Tokyo"


def test_a_learner_without_settings_gets_the_defaults_unsaved_and_without_a_query(alice):
    found, n = _settings_queries(ModelBackendWithSettings().get_user(alice.pk))
    assert n == 0 and found.pk is None and found.time_zone == "UTC"
    assert not LearnerSettings.objects.exists()  # reading a page must not write


def test_an_inactive_missing_or_malformed_user_is_nobody(alice):
    alice.is_active = False
    alice.save()
    assert ModelBackendWithSettings().get_user(alice.pk) is None
    assert ModelBackendWithSettings().get_user(alice.pk + 1000) is None
    assert ModelBackendWithSettings().get_user("not-a-number") is None


def test_the_user_it_loads_equals_the_orms_field_by_field(alice):
    LearnerSettings.objects.create(user=alice, time_zone="Europe/Berlin", desired_retention=0.85)
    alice.last_login = timezone.now()
    alice.save()
    ours = ModelBackendWithSettings().get_user(alice.pk)
    orm = User.objects.select_related("quiz_settings").get(pk=alice.pk)
    for field in User._meta.concrete_fields:
        assert getattr(ours, field.attname) == getattr(orm, field.attname), field.name
    # Converted as the ORM converts: aware datetimes and real booleans on SQLite too.
    assert ours.last_login.tzinfo is not None and ours.is_active is True
    for field in LearnerSettings._meta.concrete_fields:
        theirs = getattr(orm.quiz_settings, field.attname)
        assert getattr(ours.quiz_settings, field.attname) == theirs, field.name
    assert ours.quiz_settings.user is ours


def test_saved_settings_are_what_the_rest_of_the_request_reads(alice):
    user = ModelBackendWithSettings().get_user(alice.pk)
    assert selectors.learner_settings_get(user=user).new_per_day == 20
    services.learner_settings_update(user=user, new_per_day=5)
    found, n = _settings_queries(user)
    assert n == 0 and found.new_per_day == 5


def test_a_quiz_page_reads_the_settings_with_the_user(alice_client):
    with CaptureQueriesContext(connection) as queries:
        assert alice_client.get(reverse("quiz:today")).status_code == 200
    tables = [q["sql"] for q in queries.captured_queries]
    assert not any(sql.lstrip().startswith('SELECT "quiz_learnersettings"') for sql in tables)
    assert any('LEFT JOIN "quiz_learnersettings"' in sql for sql in tables)
