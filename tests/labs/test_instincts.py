"""The instincts page's reading: it says where a learner's model is off only when their own
points lean that way, and at which end of the varied setting only when that end leans alone."""

from __future__ import annotations

from labs.questions.instincts import Point, reading, topics


def _point(value: float, measured: float, varies: int, question: str = "q") -> Point:
    return Point(
        question=question,
        title="t",
        phrase="speculation's speedup",
        unit="×",
        value=value,
        measured=measured,
        band=0.1,
        rating=3,
        source="lab",
        varies_word="batch",
        varies_value=varies,
        varies_setting="concurrency",
    )


def test_nothing_is_said_on_fewer_than_three_points():
    assert reading([_point(3, 1, 1), _point(3, 1, 2)]) == ""


def test_a_lean_at_one_end_is_said_with_where():
    points = [
        _point(1.9, 1.07, 128), _point(1.9, 1.3, 64), _point(1.5, 1.45, 32),
        _point(1.6, 1.56, 16), _point(1.52, 1.5, 8),
    ]  # fmt: skip
    assert reading(points) == (
        "You overestimate speculation's speedup at large batch (concurrency 64 to 128): 2 of "
        "your 2 predictions there were above the band, at 1.6× the measurement (median)."
    )


def test_a_lean_everywhere_names_no_end():
    points = [_point(0.5, 1, v) for v in (1, 2, 4, 8)]
    assert reading(points) == (
        "You underestimate speculation's speedup: 4 of your 4 predictions were below the band, "
        "at 0.5× the measurement (median)."
    )


def test_no_lean_no_sentence_and_the_share_inside():
    points = [_point(1.0, 1.0, 1), _point(1.5, 1.0, 2), _point(0.6, 1.0, 4), _point(1, 1, 8)]
    assert reading(points) == ""
    (topic,) = topics(points, {"q": "speculative-decoding"})
    assert (topic.inside, len(topic.points), topic.sentence) == (2, 4, "")
    assert topic.chart()["band"] == 0.1
