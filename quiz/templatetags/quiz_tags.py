"""Template helpers: sanitised Markdown and the optional link into the labs."""

from __future__ import annotations

import re
from functools import lru_cache

import markdown
import nh3
from django import template
from django.urls import NoReverseMatch, reverse
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

_EXTENSIONS = ["fenced_code", "tables", "sane_lists"]
_ONE_PARAGRAPH = re.compile(r"^<p>(.*)</p>$", re.DOTALL)


def _own_images_only(tag: str, attribute: str, value: str) -> str | None:
    """Keep an image's source only when it is on this site (a path such as /static/...): a
    third-party image would tell another server who reads which card, and the CSP refuses it."""
    if tag == "img" and attribute in ("src", "srcset"):
        return value if value.startswith("/") and not value.startswith("//") else None
    return value


@lru_cache(maxsize=4096)
def render_markdown(text: str) -> str:
    """Markdown to HTML, then nh3 (ammonia) keeps only safe tags and attributes: no script, style,
    event handlers or javascript: URLs survive, whatever the content says, and images only from
    this site."""
    html = markdown.markdown(text or "", extensions=_EXTENSIONS, output_format="html")
    return nh3.clean(html, attribute_filter=_own_images_only)


@register.filter
def md(text: str) -> SafeString:
    return mark_safe(render_markdown(text))  # noqa: S308 - sanitised by nh3 above


@register.filter
def md_inline(text: str) -> SafeString:
    """For places that take phrasing content only (inside a button, a summary): one paragraph
    unwrapped."""
    html = render_markdown(text).strip()
    match = _ONE_PARAGRAPH.match(html)
    if match and "<p>" not in match.group(1):
        html = match.group(1)
    return mark_safe(html)  # noqa: S308 - sanitised by nh3 above


@register.filter
def num(value: float | None) -> str:
    """A card's number as a person writes it: 1,748 / 10.275 / 0.5 (no float noise)."""
    if value is None:
        return ""
    return f"{value:,.6g}" if abs(value) < 1e15 else f"{value:.6g}"


# How the cards write their units in prose: "21×", "15 %", "128 KiB".
_UNIT_SYMBOL = {"x": "×"}
_UNIT_PHRASE = {"x": "as a multiple (×)"}
_UNIT_TIGHT = {"×"}  # written against the number, with no space


@register.filter
def unit_symbol(unit: str) -> str:
    """A card's unit as the card's prose writes it: "x" is "×"."""
    return _UNIT_SYMBOL.get(unit, unit)


@register.filter
def unit_phrase(unit: str) -> str:
    """For the answer box's label: "in KiB", "as a multiple (×)"."""
    return _UNIT_PHRASE.get(unit) or f"in {unit_symbol(unit)}"


@register.filter
def with_unit(number: object, unit: str) -> str:
    """A number with its unit, as the cards write it: "21×", "128\u00a0KiB" (no break between)."""
    text = str(number)
    symbol = unit_symbol(unit or "")
    if not symbol:
        return text
    return f"{text}{symbol}" if symbol in _UNIT_TIGHT else f"{text}\u00a0{symbol}"


class CardPartNode(template.Node):
    def __init__(self, nodelist: template.NodeList, card: template.base.FilterExpression) -> None:
        self.nodelist, self.card = nodelist, card

    def render(self, context: template.Context) -> str:
        card = self.card.resolve(context)
        if card is None:
            return self.nodelist.render(context)
        # Kept on the card instance itself: a card served from quiz.selectors' per-process cache
        # keeps its parts as long as it is cached, and an edit (which drops the cached card)
        # drops them with it. Keyed by this node, so each part of each template has its own.
        parts = card.__dict__.setdefault("_rendered_parts", {})
        html = parts.get(self)
        if html is None:
            html = parts[self] = self.nodelist.render(context)
        return html


@register.tag
def cardpart(parser: template.base.Parser, token: template.base.Token) -> CardPartNode:
    """`{% cardpart card %}...{% endcardpart %}`: a part of the page that depends on the card
    alone (its Markdown, tags, steps, links), rendered once per card instance and then reused.
    Nothing of the learner's (their answer, numbers, tokens, a CSRF token) may go inside."""
    bits = token.split_contents()
    if len(bits) != 2:
        raise template.TemplateSyntaxError("cardpart takes one argument: the card")
    nodelist = parser.parse(("endcardpart",))
    parser.delete_first_token()
    return CardPartNode(nodelist, parser.compile_filter(bits[1]))


@register.simple_tag
def lab_preset_url(slug: str) -> str:
    """The labs page for a preset, or "" until the labs app serves `labs:preset-open`."""
    if not slug:
        return ""
    try:
        return reverse("labs:preset-open", args=[slug])
    except NoReverseMatch:
        return ""
