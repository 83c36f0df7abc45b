"""Lab question files: every one in content/ loads and writes back byte for byte, every lab has
two, and a bad file is refused with a message naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from django.conf import settings

from labs.parameters.params import parse_lab_params
from labs.parameters.presets import LABS
from labs.questions.content import questions_dir, questions_read
from labs.questions.spec import (
    QuestionError,
    baseline_params,
    load_question,
    parse_question,
    point_params,
    render_question,
)

CONTENT = Path(settings.BASE_DIR) / "content"
FILES = sorted(questions_dir(CONTENT).glob("*.yaml"))
GOOD = {
    "slug": "a-question",
    "lab": "batching",
    "title": "Median TTFT at max_num_seqs 16",
    "figure": "ttft_p50",
    "topic": "scheduling",
    "settings": {"max_num_seqs": 16, "concurrency": 64, "num_prompts": 128},
    "neighbours": [{"max_num_seqs": 32}],
}


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_question_file_loads_and_writes_back_unchanged(path):
    text = path.read_text(encoding="utf-8")
    question = load_question(text, str(path), expected_slug=path.stem)
    assert render_question(question) == text
    # Every point runs, and a ratio's baseline differs only where its check says.
    for at in range(len(question.neighbours) + 1):
        parse_lab_params(point_params(question, at))
        base = baseline_params(question, at)
        assert (base is None) == (question.the_figure.ratio is None)


def test_every_lab_has_at_least_two_questions():
    questions = questions_read(CONTENT)
    for lab in LABS:
        assert sum(q.lab == lab for q in questions) >= 2, lab


def test_a_point_sets_what_the_run_keeps_in_flight_with_its_batch():
    question = parse_question(
        {
            **GOOD,
            "lab": "speculative",
            "figure": "spec_speedup",
            "preset": "speculation-k3-batch-128",
            "settings": {"spec_tokens": 3, "concurrency": 128, "num_prompts": 128,
                         "output_tokens": 128},
            "neighbours": [{"concurrency": 32, "num_prompts": 64}],
        },
        "q.yaml",
    )  # fmt: skip
    # The preset keeps 128 in flight; the neighbour's batch of 32 must, not the preset's.
    assert point_params(question, 1)["max_concurrency"] == 32
    base = baseline_params(question, 1)
    assert base["spec_tokens"] == 0 and base["max_concurrency"] == 32


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"lab": "nope"}, "field 'lab' must be one of"),
        ({"figure": "speed"}, "field 'figure' must be one of"),
        ({"title": ""}, "field 'title' is required"),
        ({"topic": "Not A Slug"}, "field 'topic' must be a slug"),
        ({"extra": 1}, "unknown field 'extra'"),
        ({"settings": {"max_num_sqs": 8}}, "field 'settings.max_num_sqs' is not a lab setting"),
        ({"neighbours": []}, "field 'neighbours' must list 1 to 6"),
        ({"neighbours": [{"max_num_seqs": 0}]}, "field 'neighbours[1]' cannot run: max_num_seqs"),
        ({"neighbours": [{"max_num_seqs": 16}]}, "field 'neighbours[1]' asks a setting already"),
        ({"neighbours": [{"num_prompts": 900000}]}, "field 'neighbours[1]' is too large to"),
        ({"preset": "block-waste-1000-tokens"}, "field 'preset' must name a preset of the"),
        (
            {"figure": "batch_speedup_vs_batch1", "settings": {"concurrency": 1}},
            "field 'settings' is its own baseline",
        ),
    ],
)
def test_a_bad_question_is_refused_naming_the_file_and_field(change, says):
    data = {**GOOD, **change}
    data = {k: v for k, v in data.items() if v != ""} if change.get("title") == "" else data
    with pytest.raises(QuestionError) as caught:
        parse_question(data, "content/labs/questions/a-question.yaml")
    message = str(caught.value)
    assert message.startswith("content/labs/questions/a-question.yaml: ")
    assert says in message


def test_a_folder_is_refused_when_a_lab_has_fewer_than_two(tmp_path):
    folder = questions_dir(tmp_path)
    folder.mkdir(parents=True)
    for path in FILES:
        if (
            load_question(path.read_text(), str(path)).lab != "paged-kv"
            or "contiguous" in path.stem
        ):
            (folder / path.name).write_text(path.read_text())
    with pytest.raises(QuestionError, match="the paged-kv lab has 1 question; every lab needs"):
        questions_read(tmp_path)
    # A file whose name and slug disagree is named too.
    (folder / "other-name.yaml").write_text(yaml.safe_dump(GOOD))
    with pytest.raises(QuestionError, match="other-name.yaml: field 'slug' is 'a-question'"):
        questions_read(tmp_path)
