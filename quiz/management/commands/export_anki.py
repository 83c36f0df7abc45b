"""Write the shared deck as an Anki package (.apkg); importing a newer one updates the notes."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from quiz.anki import deck_apkg


class Command(BaseCommand):
    help = "Write the deck's active cards to an Anki .apkg (stable note ids: re-import updates)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", default="serving-school.apkg", help="the .apkg to write")

    def handle(self, *args: Any, out: str, **options: Any) -> None:
        count = deck_apkg(out)
        self.stdout.write(f"{count} cards written to {out}")
