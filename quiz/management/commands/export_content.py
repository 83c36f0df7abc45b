"""Write the database's deck back to content/, in the format load_content reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from labs import api as labs_api
from quiz.content import write_tree
from quiz.selectors import content_snapshot


class Command(BaseCommand):
    help = (
        "Write decks, active cards and lab questions to content/ (retired ones' files are removed)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--path", default=str(settings.BASE_DIR / "content"))

    def handle(self, *args: Any, path: str, **options: Any) -> None:
        tree, retired = content_snapshot()
        changed = write_tree(tree, Path(path), retired=retired)
        self.stdout.write(f"{len(tree.cards)} cards exported; {len(changed)} file(s) changed")
        questions = labs_api.questions_export(Path(path))
        self.stdout.write(f"lab questions exported; {len(questions)} file(s) changed")
        for changed_path in [*changed, *questions]:
            self.stdout.write(f"  {changed_path}")
