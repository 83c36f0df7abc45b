"""labs/api.py, the quiz's one door into labs: it hands out plain frozen data, never a model."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from django.db import models
from django.http import Http404

from labs import api
from labs.models import RunState, Sweep
from tests.conftest import make_user
from tests.labs.factories import make_run


def test_the_door_exports_no_model_and_no_queryset():
    exported = {name: getattr(api, name) for name in api.__all__}
    rows = [
        name
        for name, value in exported.items()
        if inspect.isclass(value) and issubclass(value, models.Model | models.QuerySet)
    ]
    assert not rows, f"labs.api exports Django models or querysets: {rows}"


@pytest.mark.django_db
def test_a_run_and_its_sweep_are_read_as_frozen_plain_data():
    alice, bob = make_user("alice"), make_user("bob")
    sweep = Sweep.objects.create(
        owner=alice, lab="batching", backend="sim", field="max_num_seqs", values=[8, 16]
    )
    done = make_run(alice, sweep=sweep, sweep_index=1, state=RunState.DONE, result={"x": 1.0})
    make_run(alice, sweep=sweep, sweep_index=0)  # queued: not a finished point

    run = api.run_get_for_owner(user=alice, pk=done.pk)
    assert isinstance(run, api.RunData) and run.finished and run.result == {"x": 1.0}
    assert run.sweep == api.SweepData(sweep.pk, "max_num_seqs", (8, 16), sweep.get_absolute_url())
    assert run.url == done.get_absolute_url() and run.sweep_index == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.pk = 0  # type: ignore[misc]
    assert api.finished_points(run.sweep) == {1: run}
    assert api.sweep_get_for_owner(user=alice, pk=sweep.pk) == run.sweep
    with pytest.raises(Http404):
        api.run_get_for_owner(user=bob, pk=done.pk)
