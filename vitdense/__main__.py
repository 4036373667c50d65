from vitdense.cli import main

main()
