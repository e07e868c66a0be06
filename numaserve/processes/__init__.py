"""What every child process is told and how it begins and ends:

- `specs.py`: each process's spec and command line, the specs a Plan becomes; pure data;
- `prepared.py`: the one record of what runs, what `numaserve prepare` resolved for a model,
  typed for every reader;
- `begin.py`: how every child begins, the same way (its spec, death with its parent, its CPUs
  and memory bound and checked);
- `lifecycle.py`: dying with the parent, reading the spec;
- `exitcodes.py`: the exit codes that are a contract with the supervisor;
- `logs.py`: logging in one format, text or JSON;
- `tracing.py`: OpenTelemetry for every process, and W3C Trace Context on the protocol;
- `procinfo.py`: who a pid is on this host (boot id, start time).
"""
