"""Reads for the lab pages that need no database: which settings tell a learner's runs apart."""

from __future__ import annotations

from labs.parameters.presets import LABS
from labs.runs.selectors import distinguishing_settings


def test_it_names_the_settings_that_differ_between_runs_of_a_lab():
    base = {"block_size": 16, "max_num_seqs": 64, "model": "llama-3-8b"}
    shown = distinguishing_settings(
        [
            ("batching", {**base, "max_num_seqs": 8}),
            ("batching", {**base, "max_num_seqs": 64}),
            ("batching", {**base, "max_num_seqs": 256, "block_size": 32}),
        ]
    )
    names = {name for row in shown for name, _ in row}
    assert names <= set(LABS["batching"].fields) and "max_num_seqs" in names
    assert [dict(row)["max_num_seqs"] for row in shown] == [8, 64, 256]
    assert "model" not in names  # the same in every run: says nothing


def test_a_lone_run_shows_its_labs_first_settings():
    (row,) = distinguishing_settings([("paged-kv", {"block_size": 16})])
    assert [name for name, _ in row] == list(LABS["paged-kv"].fields[:3])


def test_runs_of_different_labs_are_compared_only_within_their_lab():
    shown = distinguishing_settings(
        [("paged-kv", {"block_size": 16}), ("batching", {"block_size": 32})]
    )
    assert [name for name, _ in shown[0]] == list(LABS["paged-kv"].fields[:3])
    assert [name for name, _ in shown[1]] == list(LABS["batching"].fields[:3])
