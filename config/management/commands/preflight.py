from django.core.management.base import BaseCommand, CommandError

from config.preflight import PreflightError, check_broker, check_database


class Command(BaseCommand):
    help = (
        "Check DATABASE_URL and CELERY_BROKER_URL are reachable; exit 2 naming the one that is not."
    )

    def handle(self, *args, **options):
        try:
            check_database()
            check_broker()
        except PreflightError as exc:
            raise CommandError(str(exc), returncode=2) from None
        self.stdout.write("database and broker reachable")
