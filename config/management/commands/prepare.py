"""`make setup`'s last step: preflight, migrate and load the deck, in one process.

One Django start instead of three: on a busy two-core machine each start costs seconds.
"""

from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Check the database and broker, apply migrations and load content/ (run by make setup)."

    def handle(self, *args, **options):
        # Each writes to the process's stdout itself (wrapping self.stdout would break
        # migrate's "Applying ... OK" lines).
        call_command("preflight")
        call_command("migrate", interactive=False, verbosity=options["verbosity"])
        call_command("load_content")
