"""The authentication backend: Django's ModelBackend, whose session user arrives with the
learner's quiz settings in the same query.

Every logged-in request loads its user, and every quiz request reads the settings too. Built by
the ORM, that one query cost more CPU to compile than PostgreSQL spent running it, so it is
written here once per process, from the models' own column lists, and its values go through the
same converters the ORM applies (SQLite's datetimes, for one).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import ValidationError
from django.db import connections
from django.db.models import Model

from quiz.models import LearnerSettings


def _columns(model: type[Model]) -> list[Any]:
    return list(model._meta.concrete_fields)


@cache
def _user_with_settings_sql(alias: str) -> str:
    quote = connections[alias].ops.quote_name
    user, settings = get_user_model(), LearnerSettings
    selected = [f"u.{quote(f.column)}" for f in _columns(user)]
    selected += [f"s.{quote(f.column)}" for f in _columns(settings)]
    link, pk = quote(settings._meta.get_field("user").column), quote(user._meta.pk.column)
    return (
        f"SELECT {', '.join(selected)} FROM {quote(user._meta.db_table)} u"  # noqa: S608 - names from the models
        f" LEFT JOIN {quote(settings._meta.db_table)} s ON s.{link} = u.{pk} WHERE u.{pk} = %s"
    )


@cache
def _converters(model: type[Model], alias: str) -> list[tuple[Any, list[Any]]]:
    """Each column's expression and the converters the ORM would apply to its value."""
    connection = connections[alias]
    columns = [field.get_col(model._meta.db_table) for field in _columns(model)]
    return [
        (column, connection.ops.get_db_converters(column) + column.get_db_converters(connection))
        for column in columns
    ]


def _from_row(model: type[Model], values: list[Any], alias: str) -> Model:
    """A model instance from its columns' raw values, converted as the ORM would."""
    connection = connections[alias]
    converted = []
    for (column, converters), value in zip(_converters(model, alias), values, strict=True):
        for convert in converters:
            value = convert(value, column, connection)
        converted.append(value)
    return model.from_db(alias, [f.attname for f in _columns(model)], converted)


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
        n = len(_columns(user_model))
        user = _from_row(user_model, list(row[:n]), alias)
        settings_values = list(row[n:])
        settings = (
            None
            if settings_values[0] is None
            else _from_row(LearnerSettings, settings_values, alias)
        )
        # What `select_related("quiz_settings")` would leave: a learner without a row reads None
        # here, and quiz.selectors.learner_settings_get gives the unsaved defaults.
        user_model.quiz_settings.related.set_cached_value(user, settings)
        if settings is not None:
            LearnerSettings.user.field.set_cached_value(settings, user)
        return user if self.user_can_authenticate(user) else None
