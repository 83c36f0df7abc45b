"""Input parsing for the quiz: one place per form, clear messages naming the field and range."""

from __future__ import annotations

import re
import zoneinfo
from functools import cache

from django import forms

from quiz.models import LearnerSettings
from quiz.selectors import Workload
from quiz.services import Answer

# Thousands separators a learner may type: "1,748", "1 748", "1_748" (and thin spaces).
_SEPARATORS = re.compile(r"[,\s_\u2009\u202f]")


class AnswerForm(forms.Form):
    option = forms.IntegerField(required=False, min_value=1)
    value = forms.CharField(required=False, max_length=40, strip=True)

    def clean_value(self) -> float | None:
        raw = self.cleaned_data["value"]
        if not raw:
            return None
        text = _SEPARATORS.sub("", raw).replace("\u2212", "-")
        try:
            number = float(text)
        except ValueError:
            raise forms.ValidationError("Type a number, such as 1748 or 10.3.") from None
        if number != number or number in (float("inf"), float("-inf")):
            raise forms.ValidationError("Type a finite number.")
        return number

    def answer(self) -> Answer:
        return Answer(
            option_id=self.cleaned_data.get("option"),
            number=self.cleaned_data.get("value"),
            raw=self.data.get("value", "").strip(),
        )


RATING_ERROR = "Rating must be 1 (Again), 2 (Hard), 3 (Good) or 4 (Easy)."


class GradeForm(forms.Form):
    rating = forms.TypedChoiceField(
        choices=[(1, "Again"), (2, "Hard"), (3, "Good"), (4, "Easy")],
        coerce=int,
        error_messages={"invalid_choice": RATING_ERROR, "required": RATING_ERROR},
    )


@cache
def _zone_choices() -> list[tuple[str, str]]:
    zones = sorted(z for z in zoneinfo.available_timezones() if "/" in z or z == "UTC")
    return [(zone, zone.replace("_", " ")) for zone in zones]


class LearnerSettingsForm(forms.ModelForm):
    time_zone = forms.ChoiceField(choices=_zone_choices, help_text="Where you study.")

    class Meta:
        model = LearnerSettings
        fields = [
            "time_zone",
            "rollover_hour",
            "new_per_day",
            "reviews_per_day",
            "desired_retention",
        ]
        labels = {
            "rollover_hour": "Next day starts at (hour)",
            "new_per_day": "New cards a day",
            "reviews_per_day": "Maximum reviews a day",
            "desired_retention": "Desired retention",
        }
        help_texts = {
            "reviews_per_day": "New cards stop for the day once reviews reach this.",
        }
        widgets = {
            "desired_retention": forms.NumberInput(
                attrs={"step": "0.01", "min": "0.7", "max": "0.97"}
            ),
            "rollover_hour": forms.NumberInput(attrs={"min": "0", "max": "23"}),
        }

    def show_workload(self, workload: Workload, new_per_day: int) -> None:
        """The new-cards help says what this learner's deck will ask of them."""
        self.fields["new_per_day"].help_text = workload_help(workload, new_per_day)


def workload_help(workload: Workload, new_per_day: int) -> str:
    """The new-cards help, from the learner's own deck (quiz.selectors.workload_estimate)."""
    if not workload.not_started:
        return (
            f"You have started every card. About {workload.reviews_per_day} reviews a day over "
            f"the next {workload.days} days."
        )
    if not new_per_day:
        return f"{workload.not_started} cards not started; 0 new a day starts none of them."
    return (
        f"{workload.not_started} cards not started: at {new_per_day} a day they are all started "
        f"in {workload.days_to_start} day{'s' if workload.days_to_start != 1 else ''}. About "
        f"{workload.reviews_per_day} reviews a day over the next {workload.days} days, answering "
        "Good; fewer after, as intervals grow."
    )
