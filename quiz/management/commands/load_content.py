"""Load the deck from content/ into the database (upsert by slug; removed cards are retired), and
the lab questions beside it (content/labs/questions, through labs.api)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from labs import api as labs_api
from quiz.content import ContentError, read_tree
from quiz.models import Card
from quiz.selectors import edited_decks
from quiz.services import content_load


class Command(BaseCommand):
    help = (
        "Load content/ (decks.yaml, cards/*.yaml) into the database; loading twice changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--path", default=str(settings.BASE_DIR / "content"))
        parser.add_argument(
            "--force",
            action="store_true",
            help=(
                "Also overwrite cards and decks edited in the admin since the last load "
                "(edits are lost)."
            ),
        )

        parser.add_argument(
            "--kept",
            action="store_true",
            help="Load nothing; list the cards and decks edited in the admin that a load keeps.",
        )

    def handle(self, *args: Any, path: str, force: bool, kept: bool, **options: Any) -> None:
        if kept:
            slugs = list(
                Card.objects.filter(edited_since_load=True)
                .order_by("slug")
                .values_list("slug", flat=True)
            )
            slugs += [f"question {slug}" for slug in labs_api.questions_edited()]
            self._warn_kept(slugs, sorted(edited_decks()))
            return
        try:
            tree = read_tree(Path(path))
            # Every file is checked before anything is written.
            questions = labs_api.questions_read(Path(path))
        except (ContentError, labs_api.QuestionError) as exc:
            raise CommandError(str(exc), returncode=2) from None
        report = content_load(tree=tree, force=force)
        loaded = None if questions is None else labs_api.questions_load(questions, force=force)
        self.stdout.write(
            f"{len(tree.cards)} cards in {len(tree.decks)} deck(s): "
            f"{len(report.created)} created, {len(report.updated)} updated, "
            f"{len(report.retired)} retired, {len(report.conflicts)} kept (edited in the admin); "
            f"{len(report.deck_conflicts)} deck(s) kept (edited in the admin)"
        )
        for slug in report.retired:
            self.stdout.write(f"  retired: {slug}")
        overwritten = [*report.overwritten, *(f"deck {s}" for s in report.decks_overwritten)]
        for name in overwritten:
            self.stdout.write(f"  overwritten (--force): {name} lost its admin edits")
        left = list(report.conflicts)
        if questions is not None and loaded is not None:
            self.stdout.write(
                f"{len(questions)} lab questions: {len(loaded.created)} created, "
                f"{len(loaded.updated)} updated, {len(loaded.retired)} retired, "
                f"{len(loaded.conflicts)} kept (edited in the admin)"
            )
            for slug in loaded.overwritten:
                self.stdout.write(f"  overwritten (--force): question {slug} lost its admin edits")
            left += [f"question {slug}" for slug in loaded.conflicts]
        self._warn_kept(left, report.deck_conflicts)

    def _warn_kept(self, slugs: list[str], deck_slugs: list[str]) -> None:
        names = [*slugs, *(f"deck {slug}" for slug in deck_slugs)]
        if not names:
            return
        self.stdout.write(
            self.style.WARNING(
                f"{len(slugs)} card(s) or question(s) and {len(deck_slugs)} deck(s) edited in the "
                "admin differ "
                "from content/ and were left as they are. Run `manage.py export_content` to write "
                "the edits to content/, or `manage.py load_content --force` to discard them:"
            )
        )
        for name in names:
            self.stdout.write(f"  conflict: {name}")
