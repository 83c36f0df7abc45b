"""The authentication backend: Django's ModelBackend, whose session user arrives with the
learner's quiz settings in the same query.

Every logged-in request loads its user, and every quiz request reads the settings too. Built by
the ORM, that one query cost more CPU to compile than PostgreSQL spent running it, so it is
written here once per process (config/rows.py: the models' own column lists, and the ORM's own
converters for the values, SQLite's datetimes for one).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import ValidationError
from django.db import connections

from config import rows
from quiz.models import LearnerSettings


@cache
def _user_with_settings_sql(alias: str) -> str:
    quote = connections[alias].ops.quote_name
    user, settings = get_user_model(), LearnerSettings
    selected = f"{rows.select_list(user, 'u', alias)}, {rows.select_list(settings, 's', alias)}"
    link, pk = quote(settings._meta.get_field("user").column), quote(user._meta.pk.column)
    return (
        f"SELECT {selected} FROM {quote(user._meta.db_table)} u"  # noqa: S608 - names from the models
        f" LEFT JOIN {quote(settings._meta.db_table)} s ON s.{link} = u.{pk} WHERE u.{pk} = %s"
    )


class ModelBackendWithSettings(ModelBackend):
    def get_user(self, user_id: Any) -> Any:
        user_model = get_user_model()
        try:
            pk = user_model._meta.pk.to_python(user_id)
        except ValidationError:
            return None
        alias = user_model._default_manager.db
        connection = connections[alias]
        with connection.cursor() as cursor:
            cursor.execute(_user_with_settings_sql(alias), [pk])
            row = cursor.fetchone()
        if row is None:
            return None
        n = len(rows.columns(user_model))
        user = rows.from_row(user_model, row[:n], alias)
        settings_values = row[n:]
        settings = (
            None
            if settings_values[0] is None
            else rows.from_row(LearnerSettings, settings_values, alias)
        )
        # What `select_related("quiz_settings")` would leave: a learner without a row reads None
        # here, and quiz.selectors.learner_settings_get gives the unsaved defaults.
        user_model.quiz_settings.related.set_cached_value(user, settings)
        if settings is not None:
            LearnerSettings.user.field.set_cached_value(settings, user)
        return user if self.user_can_authenticate(user) else None
