"""python -m vitdense.bench COMMAND (see `vitdense.bench`)."""

from vitdense.bench.cli import main

main()
