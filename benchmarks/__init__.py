"""numaserve's benchmarks: each module is one measurement, run from the repository's root as
`.venv/bin/python -m benchmarks.NAME` (docs/benchmarks.md gives each one's command and
figures). They use numaserve's own API, and numaserve.testing to run it for real;
`peer_apps/` holds what the peers they are measured against run."""
