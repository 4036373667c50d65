"""python -m vitdense.viz COMMAND ... (see `vitdense.viz.commands`)."""

from vitdense.viz.commands import main

if __name__ == "__main__":
    main()
