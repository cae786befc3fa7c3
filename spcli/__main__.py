from spcli.cli import main

main()
