"""Django's `TextChoices` and `IntegerChoices`, as the type checker should see them.

Django ships no type hints and mypy runs here without django-stubs, so to mypy a
`models.TextChoices` subclass is an unknown class and a member written `DONE = "done", "done"` is
that tuple. Under TYPE_CHECKING these names are a `StrEnum` / `IntEnum` with the parts of
Django's API this project uses; at run time they are Django's own classes, unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["IntegerChoices", "TextChoices"]

if TYPE_CHECKING:
    from enum import IntEnum, StrEnum
    from typing import ClassVar, Self

    class TextChoices(StrEnum):
        _value_: str
        label: str
        choices: ClassVar[list[tuple[str, str]]]

        # A member is written (value, label); Django's metaclass keeps the value.
        def __new__(cls, value: str, label: str = "") -> Self: ...

    class IntegerChoices(IntEnum):
        _value_: int
        label: str
        choices: ClassVar[list[tuple[int, str]]]

        def __new__(cls, value: int, label: str = "") -> Self: ...

else:
    from django.db.models import IntegerChoices, TextChoices
