import sys

from vitdense.cli_help import COMMANDS, HELP_ARGS, print_top_level_help, run_command

if sys.argv[1:] in HELP_ARGS:  # before vitdense.cli, whose imports (Lightning, torch) take seconds
    print_top_level_help(sys.argv[1:])
if sys.argv[1:2] and sys.argv[1] in COMMANDS:  # export, serve: a trained model without the trainer (no Lightning)
    run_command(sys.argv[1], sys.argv[2:])
    raise SystemExit(0)

from vitdense.cli import main  # noqa: E402

main()
