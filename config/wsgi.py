import os
import sys

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()

if os.environ.get("SKIP_PREFLIGHT") != "1":
    from config.preflight import PreflightError, check_broker, check_database

    try:
        check_database()
        check_broker()
    except PreflightError as exc:
        sys.stderr.write(f"error: {exc}\n")
        raise SystemExit(2) from None
