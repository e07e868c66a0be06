"""The `numaserve` command: common.py holds the group, its errors and the options commands
share; machine.py the commands that read the machine (topology, plan), server_calls.py those that ask
a running server, serving.py those that run or stop one, tuning.py `tune`; control.py how
`status` and `stop` reach a server on this host (its supervisor's control socket); __main__.py
`python -m numaserve.cli`, how the supervisor runs `prepare`."""

from numaserve.cli import machine, server_calls, serving, tuning
from numaserve.cli.common import main

__all__ = ["machine", "main", "server_calls", "serving", "tuning"]
