"""What every child process is told and how it begins and ends: its spec and command line
(`specs.py`), what it does at start (`lifecycle.py`: die with its parent, read its spec), the
exit codes that are a contract with the supervisor (`exitcodes.py`), logging in one format
(`logs.py`), and what /proc says of a process (`procinfo.py`)."""
