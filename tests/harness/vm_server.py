"""The server config that both suites in the 2-node virtual machine run (tests/numa_vm.py).

Each node: one core reserved for its router shard (routers: auto), one single-core instance on
the other, SMT siblings left idle. Emulation is slow: torch takes minutes to import (the ONNX
export imports it), hence the generous start timeout and heartbeat, and a named precision:
`quantize: auto` would run every candidate over the accuracy gate's 320 passages first.
"""

CONFIG = """
model: {{path: "{model}", task: classify, max_length: 64, backend: onnxruntime, quantize: int8}}
server: {{endpoint: "{endpoint}", heartbeat_ms: 2000, heartbeat_liveness: 10, routers: auto}}
supervisor: {{start_timeout_s: 900}}
placement:
  reserved_cores: 2
  smt: false
  pools: [{{name: main, max_tokens: 64, cores_per_instance: 1, instances: auto}}]
"""
