"""The machine: what it has (CPUs, nodes, instruction sets), where each process of a server
goes, and binding a process there (docs/architecture.md, "host/"). Its modules:

- `topology.py`: the CPU topology from sysfs (or `lscpu -p`), as a `CPUTopology` with set
  queries, surviving broken firmware;
- `cpulist.py`: the kernel's CPU list and mask formats;
- `cpuset.py`: a set of CPUs as one immutable value (set algebra, its whole cores, its nodes);
- `isa.py`: the instruction sets that decide int8 and bf16 kernels (AVX2, VNNI, BF16, AMX);
- `cpu_quota.py`: the CPU time a cgroup may use, and what it says of how CPUs were handed out;
- `placement.py`: topology and pools to a Plan of slots; pure;
- `shards.py`: which instances each router shard owns, and where it runs; pure;
- `ledger.py`: the host-wide core ledger, so that servers on one host plan around each other;
- `pinning.py`: binding a process to its CPUs and memory, and reading its live affinity (the
  one reader);
- `numastat.py`: the kernel's per-node allocation counters;
- `local_ports.py`: the ports outgoing connections may be given, which a listener should avoid.
"""
