"""Admin deletes that stay within a web process's memory and time, however long a learner's log.

Django's delete confirmation collects every row a delete would cascade to (NestedObjects loads
each one to list it), and its delete collects them again before deleting. For a learner with
600,000 reviews that is gigabytes and minutes in one web process. Here:

- the confirmation counts the rows each cascade would take (one COUNT per relation, no rows
  loaded) and lists objects only when the whole delete is small (LIST_LIMIT rows);
- the delete walks the same cascades children first and deletes each in batches of BATCH rows
  by primary key, all in one transaction, so Django's own collector (signals, SET_NULL) only ever
  sees one batch;
- "delete selected" with "select all" posts the selection back as "select all" rather than as
  one hidden field per row, and counts it rather than loading it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.admin.utils import get_deleted_objects as django_get_deleted_objects
from django.contrib.admin.utils import model_ngettext
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import models, router, transaction
from django.db.models.deletion import get_candidate_relations_to_delete
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.utils.text import capfirst

# A delete of at most this many rows (the objects and all they cascade to) is listed row by row
# as Django lists it; a bigger one is shown as counts per kind of row.
LIST_LIMIT = 200
# Objects named on a counted page (the rest are counted).
NAMED = 20
# Rows per DELETE statement.
BATCH = 5_000
# Cascades deeper than this are left to Django's collector (none of this project's are).
MAX_DEPTH = 6

Counted = list[tuple[type[models.Model], models.QuerySet, int]]


def _as_queryset(objs: Iterable[models.Model] | models.QuerySet) -> models.QuerySet:
    """The delete view passes [obj]; the action passes the changelist's queryset (perhaps
    annotated, as the deck list is): either becomes a plain filter by primary key."""
    if isinstance(objs, models.QuerySet):
        model = objs.model
        return model._base_manager.filter(pk__in=objs.order_by().values("pk"))
    objs = list(objs)
    model = type(objs[0])
    return model._base_manager.filter(pk__in=[obj.pk for obj in objs])


def _children(
    queryset: models.QuerySet, rules: tuple[Any, ...]
) -> Iterator[tuple[Any, models.QuerySet]]:
    """The related rows each relation with an on_delete in `rules` ties to `queryset`."""
    for relation in get_candidate_relations_to_delete(queryset.model._meta):
        if relation.on_delete in rules:
            related = relation.related_model._base_manager
            yield relation, related.filter(**{f"{relation.field.name}__in": queryset})


def cascade_counts(queryset: models.QuerySet, depth: int = 0) -> Counted:
    """(model, rows, count) for `queryset` and every non-empty cascade below it; no row loaded."""
    count = queryset.count()
    found: Counted = [(queryset.model, queryset, count)]
    if count and depth < MAX_DEPTH:
        for _, child in _children(queryset, (models.CASCADE,)):
            found.extend(entry for entry in cascade_counts(child, depth + 1) if entry[2])
    return found


def _protected(counted: Counted) -> list[str]:
    """Rows that would stop the delete (PROTECT, RESTRICT), a few named, the rest counted."""
    lines: list[str] = []
    for _, rows, _ in counted:
        for _, blocking in _children(rows, (models.PROTECT, models.RESTRICT)):
            total = blocking.count()
            if not total:
                continue
            label = capfirst(blocking.model._meta.verbose_name)
            lines.extend(f"{label}: {obj}" for obj in blocking[:NAMED])
            if total > NAMED:
                lines.append(
                    f"… and {total - NAMED:,} more {blocking.model._meta.verbose_name_plural}"
                )
    return lines


def get_deleted_objects(
    objs: Iterable[models.Model] | models.QuerySet, request: HttpRequest, admin_site: Any
) -> tuple[list[Any], dict[str, int], set[str], list[str]]:
    """What ModelAdmin.get_deleted_objects returns (rows to list, count per kind, kinds the
    user may not delete, protected rows), bounded: above LIST_LIMIT rows, counts only."""
    if isinstance(objs, models.QuerySet) and not objs.exists():
        return [], {}, set(), []
    if not isinstance(objs, models.QuerySet) and not list(objs):
        return [], {}, set(), []
    top = _as_queryset(objs)
    counted = cascade_counts(top)
    if sum(count for _, _, count in counted) <= LIST_LIMIT:
        return django_get_deleted_objects(objs, request, admin_site)
    model_count: dict[str, int] = {}
    perms_needed: set[str] = set()
    for model, _, count in counted:
        name = str(model._meta.verbose_name_plural)
        model_count[name] = model_count.get(name, 0) + count
        registered = admin_site.is_registered(model)
        if registered and not admin_site.get_model_admin(model).has_delete_permission(request):
            perms_needed.add(str(model._meta.verbose_name))
    label = capfirst(top.model._meta.verbose_name)
    named: list[Any] = [f"{label}: {obj}" for obj in top[:NAMED]]
    selected = counted[0][2]
    if selected > NAMED:
        named.append(f"… and {selected - NAMED:,} more {top.model._meta.verbose_name_plural}")
    related = sum(count for _, _, count in counted[1:])
    if related:
        named.append(
            f"with {related:,} related rows: too many to list here, counted in the summary above"
        )
    return named, model_count, perms_needed, _protected(counted)


def _delete_children_first(queryset: models.QuerySet, depth: int) -> None:
    if depth < MAX_DEPTH:
        for _, child in _children(queryset, (models.CASCADE,)):
            if child.exists():
                _delete_children_first(child, depth + 1)
    # Onwards by key range, BATCH rows at a time: the range's end is read from the index, and
    # Django deletes the range (one DELETE with no keys sent when nothing has to see the rows).
    # Each batch starts after the last one rather than from the beginning: in one transaction
    # PostgreSQL cannot yet drop the index entries of the rows deleted, so a restart would step
    # over all of them every time.
    keys = queryset.order_by("pk").values_list("pk", flat=True)
    done_to = None
    while True:
        rest = keys if done_to is None else keys.filter(pk__gt=done_to)
        last = rest[BATCH - 1 : BATCH].first() or rest.last()
        if last is None:
            return
        part = queryset if done_to is None else queryset.filter(pk__gt=done_to)
        # Django's delete of one batch: its signals and SET_NULLs, nothing left to cascade.
        part.filter(pk__lte=last).order_by().delete()
        done_to = last


def delete_in_batches(objs: Iterable[models.Model] | models.QuerySet) -> None:
    """Delete `objs` and all they cascade to, BATCH rows a statement, in one transaction."""
    top = _as_queryset(objs)
    with transaction.atomic(using=router.db_for_write(top.model)):
        _delete_children_first(top, 0)


def bad_action_input(request: HttpRequest, pk_field: models.Field) -> str | None:
    """What is wrong with a posted action's row keys or index, or None (Django's changelist
    turns either into a 500: int("²") raises though "²".isdigit())."""
    if request.method != "POST":
        return None
    index = request.POST.get("index", "0")
    if not (index.isascii() and index.isdigit()):
        return f"The action's index must be a whole number written in 0-9, not {index[:20]!r}."
    for key in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
        try:
            pk_field.to_python(key)
        except ValidationError:
            return (
                f"The selected rows ({helpers.ACTION_CHECKBOX_NAME}) must be row ids written in"
                f" 0-9, not {key[:20]!r}. Nothing was changed."
            )
    return None


class BoundedDeleteMixin:
    """For every ModelAdmin of the site: the bounded confirmation and delete above, and an
    action's selection checked before Django reads it."""

    admin_site: Any
    model: type[models.Model]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        problem = bad_action_input(request, self.model._meta.pk)
        if problem:
            self.message_user(request, problem, messages.ERROR)  # type: ignore[attr-defined]
            return redirect(request.get_full_path())
        return super().changelist_view(request, extra_context)  # type: ignore[misc]

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple:
        return get_deleted_objects(objs, request, self.admin_site)

    def delete_model(self, request: HttpRequest, obj: models.Model) -> None:
        delete_in_batches([obj])

    def delete_queryset(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        delete_in_batches(queryset)

    def log_deletions(self, request: HttpRequest, queryset: Any) -> None:
        """One history entry a row for a small delete (as Django writes them); one entry for
        the whole of a big one, rather than a row loaded and written for each. (The delete
        view passes [obj].)"""
        count = queryset.count() if isinstance(queryset, models.QuerySet) else len(queryset)
        if count <= LIST_LIMIT:
            super().log_deletions(request, queryset)  # type: ignore[misc]
            return
        LogEntry.objects.create(
            user_id=request.user.pk,
            content_type=ContentType.objects.get_for_model(self.model, for_concrete_model=False),
            object_id=None,
            object_repr=f"{count:,} {self.model._meta.verbose_name_plural} (one bulk delete)"[:200],
            action_flag=DELETION,
            change_message="",
        )


@admin.action(permissions=["delete"], description="Delete selected %(verbose_name_plural)s")
def delete_selected(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: models.QuerySet
) -> TemplateResponse | None:
    """Django's action, except that a confirmed delete counts the rows instead of loading them,
    and a "select all" confirmation posts back "select all" instead of every row's key."""
    select_across = request.POST.get("select_across") == "1"
    if request.POST.get("post"):
        _, _, perms_needed, protected = modeladmin.get_deleted_objects(queryset, request)
        if not protected:
            if perms_needed:
                raise PermissionDenied
            count = queryset.count()
            if count:
                modeladmin.log_deletions(request, queryset)
                modeladmin.delete_queryset(request, queryset)
                modeladmin.message_user(
                    request,
                    f"Deleted {count:,} {model_ngettext(modeladmin.opts, count)}.",
                )
            return None
    response = django_delete_selected(modeladmin, request, queryset)
    context = response.context_data if isinstance(response, TemplateResponse) else None
    if select_across and context is not None:
        # The changelist runs an action only with a row ticked: post back the first one and
        # "select all"; the filters come back in the page's own address.
        context["select_across_pk"] = queryset.values_list("pk", flat=True)[:1]
        context["queryset"] = queryset.none()
    return response
