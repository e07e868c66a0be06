"""numaserve: BERT-like models served from many pinned, NUMA-local CPU instances."""

__version__ = "0.1.0"
