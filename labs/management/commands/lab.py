"""`python manage.py lab <subcommand>`: a thin dispatcher to the modules in labs/cli/.

Each subcommand module has `HELP`, `add_arguments(parser)` and `run(options, stdout)`; to add one,
import it and list it in SUBCOMMANDS. Bad lab parameters (ParamError) and bad options end the
command with one line on stderr and exit status 2, as argparse does, never a traceback.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser

from labs.backends.base import BackendError
from labs.cli import calibrate as calibrate_cli
from labs.cli import error_line
from labs.cli import make_model as make_model_cli
from labs.cli import predict as predict_cli
from labs.cli import run as run_cli
from labs.cli import serve_args as serve_args_cli
from labs.parameters.params import ParamError

SUBCOMMANDS: dict[str, ModuleType] = {
    "calibrate": calibrate_cli,
    "predict": predict_cli,
    "run": run_cli,
    "serve-args": serve_args_cli,
    "make-model": make_model_cli,
}


class _OneLineErrorParser(CommandParser):
    """A subcommand parser whose usage errors are one line, not the whole option list."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        # Report unknown options here, in one line, before the top-level parser prints its usage.
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def error(self, message: str) -> NoReturn:
        if self.called_from_command_line:
            self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
        raise CommandError(f"Error: {message}", returncode=2)


class Command(BaseCommand):
    help = "Lab tools: " + ", ".join(SUBCOMMANDS) + "."

    def add_arguments(self, parser: CommandParser) -> None:
        subparsers = parser.add_subparsers(
            dest="subcommand", required=True, parser_class=_OneLineErrorParser
        )
        for name, module in SUBCOMMANDS.items():
            sub = subparsers.add_parser(name, help=module.HELP, description=module.HELP)
            module.add_arguments(sub)

    def handle(self, *args: Any, **options: Any) -> None:
        module = SUBCOMMANDS[options["subcommand"]]
        try:
            module.run(options, self.stdout)
        except ParamError as error:
            raise CommandError(error_line(error), returncode=2) from None
        except BackendError as error:
            # Not bad input: the engine could not run. One line, exit 1, no traceback.
            raise CommandError(str(error), returncode=1) from None
