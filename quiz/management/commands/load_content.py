"""Load the deck from content/ into the database (upsert by slug; removed cards are retired)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from quiz.content import ContentError, read_tree
from quiz.services import content_load


class Command(BaseCommand):
    help = (
        "Load content/ (decks.yaml, cards/*.yaml) into the database; loading twice changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--path", default=str(settings.BASE_DIR / "content"))

    def handle(self, *args: Any, path: str, **options: Any) -> None:
        try:
            tree = read_tree(Path(path))
        except ContentError as exc:
            raise CommandError(str(exc), returncode=2) from None
        report = content_load(tree=tree)
        self.stdout.write(
            f"{len(tree.cards)} cards in {len(tree.decks)} deck(s): "
            f"{len(report.created)} created, {len(report.updated)} updated, "
            f"{len(report.retired)} retired"
        )
        for slug in report.retired:
            self.stdout.write(f"  retired: {slug}")
