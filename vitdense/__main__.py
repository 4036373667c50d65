import sys

from vitdense.cli_help import HELP_ARGS, print_top_level_help

if sys.argv[1:] in HELP_ARGS:  # before vitdense.cli, whose imports (Lightning, torch) take seconds
    print_top_level_help(sys.argv[1:])

from vitdense.cli import main  # noqa: E402

main()
