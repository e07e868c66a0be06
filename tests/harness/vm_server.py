"""The server configs the NUMA suite in the 2-node virtual machine runs (tests/numa_vm.py).

CONFIG: on each node, one core reserved for its router shard
(routers: auto), one single-core instance on the other, SMT siblings left idle. Emulation is
slow: torch takes minutes to import (an ONNX export or a CTranslate2 conversion imports it),
hence the generous start timeout and heartbeat, and named precisions: `quantize: auto` would
run every candidate over the accuracy gate's 320 passages first. No HTTP front (`http: ""`):
no test here asks one, and each process spends minutes importing under emulation.
"""

CONFIG = """
model: {{path: "{model}", task: classify, max_length: 64, backend: onnxruntime, quantize: int8}}
server: {{endpoint: "{endpoint}", http: "", heartbeat_ms: 2000, heartbeat_liveness: 10,
          routers: auto}}
supervisor: {{start_timeout_s: 900}}
placement:
  reserved_cores: 2
  smt: false
  pools: [{{name: main, max_tokens: 64, cores_per_instance: 1, instances: auto}}]
"""


def prepare_every_model(model: str, isa: tuple[str, ...]) -> None:
    """What `numaserve prepare` builds for every model of these configs on a CPU with `isa`,
    built here, in $NUMASERVE_CACHE (tests/numa_vm.py: ensure_artifacts)."""
    from numaserve.backends import prepare_model
    from numaserve.config.schema import parse_config, with_checkpoint_lengths

    config = with_checkpoint_lengths(
        parse_config(CONFIG.format(model=model, endpoint="tcp://127.0.0.1:5555"))
    )
    for served in config.models:
        assert prepare_model(served.model, isa), f"{served.name} could not be prepared"
