"""Template filters for lab numbers, so every page formats them as the results table does."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

from labs.backends import is_simulated
from labs.explanation.results import format_value
from labs.sim.engine_model import short_where_label

register = template.Library()


@register.filter
def simulated(backend: str) -> bool:
    """{% if run.backend|simulated %}: whether the backend's runs are simulations (asked of the
    backend registry, so no template compares a backend's name)."""
    try:
        return is_simulated(backend)
    except ValueError:
        return False  # not a backend's name (a row of a backend since removed)


@register.filter
def fmt(value: Any, unit: str = "") -> str:
    """{{ run.result.ttft_s.p50|fmt:"s" }} -> "8.31 ms"."""
    return format_value(value, unit)


@register.filter
def param(value: Any) -> str:
    """A parameter's value as the form shows it (on/off for booleans, "default" for unset)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None or value == "":
        return "default"
    if isinstance(value, float) and value.is_integer():
        return f"{int(value):,}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


@register.filter
def get_item(mapping: Any, key: str) -> Any:
    return mapping.get(key) if hasattr(mapping, "get") else None


@register.filter
def index(sequence: Any, i: int) -> Any:
    try:
        return sequence[i]
    except (IndexError, TypeError, KeyError):
        return None


@register.filter
def short_where(where: Any) -> str:
    """A run's provenance as its badge says it: "simulated · H100 SXM · calibrated"."""
    return short_where_label(str(where or ""))


@register.filter
def ago(when: datetime | None) -> str:
    """'just now' under a minute (timesince says '0 minutes'), else '3 minutes ago'."""
    if when is None:
        return ""
    if timezone.now() - when < timedelta(minutes=1):
        return "just now"
    return f"{timesince(when)} ago"
