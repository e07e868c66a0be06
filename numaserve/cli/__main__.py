"""python -m numaserve.cli: how the supervisor runs `prepare`."""

from numaserve.cli import main

main()
