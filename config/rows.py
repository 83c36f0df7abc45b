"""Model rows read and written with hand-written SQL, their values converted as the ORM's are.

The quiz's hottest statements are written by hand: compiling them through the ORM cost more CPU
than the database spent running them. These helpers keep them the ORM's in every other way:
columns come from the models' own field lists, values go in through each field's
`get_db_prep_save` (JSON, SQLite's datetimes) and come out through the converters the ORM would
apply. Statements are built once per model and database alias.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any, TypeVar

from django.db import connections
from django.db.models import Field, Model

M = TypeVar("M", bound=Model)


def columns(model: type[Model]) -> Sequence[Field]:
    return model._meta.concrete_fields


@cache
def select_list(model: type[Model], table: str, alias: str) -> str:
    """`table.col, ...` for every concrete field, in the order from_row reads them."""
    quote = connections[alias].ops.quote_name
    return ", ".join(f"{table}.{quote(f.column)}" for f in columns(model))


@cache
def _converters(model: type[Model], alias: str) -> list[tuple[Any, list[Any]]]:
    """Each column's expression and the converters the ORM would apply to its value."""
    connection = connections[alias]
    expressions = [field.get_col(model._meta.db_table) for field in columns(model)]
    return [
        (column, connection.ops.get_db_converters(column) + column.get_db_converters(connection))
        for column in expressions
    ]


def from_row(model: type[M], values: Sequence[Any], alias: str) -> M:
    """A model instance from its columns' raw values (as select_list orders them)."""
    connection = connections[alias]
    converted = []
    # mypy does not see type[X] as Hashable (python/mypy#11470): a model passed to a cached
    # helper needs an ignore, here and in insert() and update().
    steps = _converters(model, alias)  # type: ignore[arg-type]  # mypy#11470
    for (column, converters), value in zip(steps, values, strict=True):
        for convert in converters:
            value = convert(value, column, connection)
        converted.append(value)
    return model.from_db(alias, [f.attname for f in columns(model)], converted)


def db_values(model: type[Model], values: Mapping[str, Any], alias: str) -> list[Any]:
    """`values` (by field name) as the ORM sends them to the database."""
    connection, meta = connections[alias], model._meta
    return [meta.get_field(name).get_db_prep_save(v, connection) for name, v in values.items()]


@cache
def _insert_sql(model: type[Model], alias: str, unless_exists: tuple[str, ...]) -> str:
    connection, meta = connections[alias], model._meta
    quote = connection.ops.quote_name
    names = [quote(f.column) for f in columns(model) if f is not meta.pk]
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(names)})"  # noqa: S608 - names from the model
        f" VALUES ({', '.join(['%s'] * len(names))})"
    )
    if unless_exists:
        target = ", ".join(quote(meta.get_field(name).column) for name in unless_exists)
        sql += f" ON CONFLICT ({target}) DO NOTHING"
    if connection.features.can_return_columns_from_insert:
        sql += f" RETURNING {quote(meta.pk.column)}"
    return sql


def insert(obj: Model, *, unless_exists: tuple[str, ...] = (), alias: str = "default") -> bool:
    """INSERT `obj` and set its primary key. With `unless_exists` (the fields of a unique
    constraint), a row already there is left as it is and False is returned."""
    connection, meta = connections[alias], type(obj)._meta
    fields = [f for f in columns(type(obj)) if f is not meta.pk]
    params = [f.get_db_prep_save(f.pre_save(obj, add=True), connection) for f in fields]
    with connection.cursor() as cursor:
        sql = _insert_sql(type(obj), alias, unless_exists)  # type: ignore[arg-type]  # mypy#11470
        cursor.execute(sql, params)
        # RETURNING gives no row where the conflict left the row alone (SQLite counts rows
        # only once they are fetched).
        if connection.features.can_return_columns_from_insert:
            returned = cursor.fetchone()
            if returned is None:
                return False
            pk = returned[0]
        elif cursor.rowcount == 0:
            return False
        else:
            pk = cursor.lastrowid
    obj.pk = meta.pk.to_python(pk)
    obj._state.adding, obj._state.db = False, alias
    return True


@cache
def _update_sql(
    model: type[Model],
    alias: str,
    names: tuple[str, ...],
    increment: tuple[str, ...],
    expect: tuple[str, ...],
) -> str:
    meta = model._meta
    quote = connections[alias].ops.quote_name

    def column(name: str) -> str:
        return quote(meta.get_field(name).column)

    sets = [f"{column(n)} = %s" for n in names]
    sets += [f"{column(n)} = {column(n)} + 1" for n in increment]
    where = [f"{quote(meta.pk.column)} = %s", *(f"{column(n)} = %s" for n in expect)]
    return (
        f"UPDATE {quote(meta.db_table)} SET {', '.join(sets)}"  # noqa: S608 - names from the model
        f" WHERE {' AND '.join(where)}"
    )


def update(
    model: type[Model],
    pk: Any,
    values: Mapping[str, Any],
    *,
    increment: Iterable[str] = (),
    expect: Mapping[str, Any] | None = None,
    alias: str = "default",
) -> int:
    """UPDATE one row: set `values`, add 1 to each field in `increment`, only where the row still
    holds `expect` (an optimistic lock). Returns the rows changed (0 or 1)."""
    expect = expect or {}
    names = tuple(values), tuple(increment), tuple(expect)
    sql = _update_sql(model, alias, *names)  # type: ignore[arg-type]  # mypy#11470
    params = [*db_values(model, values, alias), pk, *db_values(model, expect, alias)]
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
