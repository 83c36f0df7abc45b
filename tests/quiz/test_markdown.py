"""Card Markdown is rendered, then sanitised: no script or event attribute survives."""

from __future__ import annotations

import pytest

from quiz.templatetags.quiz_tags import lab_preset_url, md, md_inline


@pytest.mark.parametrize(
    "text",
    [
        "<script>alert(1)</script>",
        '<img src="x" onerror="alert(1)">',
        '<a href="javascript:alert(1)">x</a>',
        '<div onclick="steal()">hi</div>',
        "[link](javascript:alert(1))",
        "<svg onload=alert(1)></svg>",
        "<style>body{display:none}</style>",
        '<iframe src="https://evil.example"></iframe>',
    ],
)
def test_it_strips_scripts_and_event_attributes(text):
    html = str(md(text)).lower()
    assert "<script" not in html and "javascript:" not in html
    assert "onerror" not in html and "onclick" not in html and "onload" not in html
    assert "<style" not in html and "<iframe" not in html


def test_it_renders_markdown():
    html = str(md("**KV** cache with `block_size`\n\n- one\n- two"))
    assert "<strong>KV</strong>" in html and "<code>block_size</code>" in html
    assert "<li>one</li>" in html


def test_it_unwraps_a_single_paragraph_for_inline_places():
    assert str(md_inline("a *b*")) == "a <em>b</em>"
    assert str(md_inline("one\n\ntwo")).count("<p>") == 2


def test_it_links_to_a_lab_preset_only_once_the_labs_serve_it():
    from django.urls import NoReverseMatch, reverse

    try:
        expected = reverse("labs:preset-open", args=["p-1"])
    except NoReverseMatch:
        expected = ""
    assert lab_preset_url("p-1") == expected
    assert lab_preset_url("") == ""


def test_it_drops_third_party_images_and_keeps_the_sites_own():
    from quiz.templatetags.quiz_tags import render_markdown

    html = render_markdown(
        "![a](https://tracker.example/p.png) ![b](//tracker.example/q.png) "
        '![c](/static/img/ok.png) <img src="http://x.example/y" srcset="http://x.example/z 2x">'
    )
    assert "tracker.example" not in html and "x.example" not in html
    assert 'src="/static/img/ok.png"' in html
    assert 'alt="a"' in html  # the image's text stays
