"""`status` answered by one router shard for the whole server (status/merge.py), and the table
a person reads (status/format.py): pure, on hand-made shard reports."""

from dataclasses import replace

from numaserve.status.format import format_status, memory_lines, weights_lines
from numaserve.status.merge import whole_server
from tests.harness.reports import instance, report


def shard(n: int, instances: list, model: str = "default"):
    return report(n, tuple(instances), model_name=model, requests={"ok": 0})


def entry(name: str, shard_n: int, pid: int, state: str, routed: bool):
    return instance(name, shard=shard_n, pid=pid, state=state, routed=routed)


def test_an_instance_shows_the_supervisors_latest_state_and_its_own_shards_routing():
    # Shard 1 answers with the supervisor's newest table (main-0 now ready). Shard 0's part is
    # a round older: it hears main-0 (which is how the supervisor knew it was ready) but its
    # copy of the table still says starting. systemd has been told READY=1 at this point.
    own = shard(1, [entry("main-0", 0, 10, "ready", False), entry("main-1", 1, 11, "ready", True)])
    peer = shard(
        0, [entry("main-0", 0, 10, "starting", True), entry("main-1", 1, 11, "starting", False)]
    )
    whole = {i.name: i for i in whole_server(own, [peer]).instances}
    assert whole["main-0"].state == whole["main-1"].state == "ready"
    assert whole["main-0"].routed and whole["main-1"].routed


def test_a_peers_view_of_an_older_process_in_the_slot_is_not_taken_for_the_new_one():
    own = shard(1, [entry("main-0", 0, 20, "starting", False)])
    peer = shard(0, [entry("main-0", 0, 10, "ready", True)])  # the pid before a restart
    (main0,) = whole_server(own, [peer]).instances
    assert main0.pid == 20 and main0.state == "starting" and not main0.routed


def two_models(paths: dict | None = None):
    """Shard 0 routes to toxicity's instance, shard 1 to embed's; both pools are `main`.
    `paths`: each model's model path, as the shard that routes its instance knows it."""
    table = [
        replace(entry(name, n, 10 + n, "ready", False), model_name=model, cpus=[n], nodes=[0])
        for n, (name, model) in enumerate(
            (("toxicity.main-0", "toxicity"), ("embed.main-0", "embed"))
        )
    ]
    routed = [
        replace(slot, routed=True, model_path=(paths or {}).get(slot.model_name)) for slot in table
    ]
    own = shard(0, [routed[0], table[1]], "toxicity")
    peer = shard(1, [table[0], routed[1]], "embed")
    return whole_server(own, [peer])


def test_pools_of_the_same_name_in_two_models_are_two_pools():
    pools = two_models().pools
    assert [(p.model_name, p.name, p.ready) for p in pools] == [
        ("toxicity", "main", 1),
        ("embed", "main", 1),
    ]


def test_the_status_table_names_each_instances_model_and_each_pools():
    lines = format_status(two_models()).splitlines()
    assert lines[0].split()[:3] == ["instance", "model", "pool"]
    assert lines[1].split()[:3] == ["toxicity.main-0", "toxicity", "main"]
    assert "pools: toxicity.main (<= 64 tokens): 0 queued, 1 ready, embed.main" in "\n".join(lines)
    assert any(line.startswith("router shard 1 of embed (CPUs 1)") for line in lines)


def test_a_supervised_shard_shows_the_affinity_the_supervisor_read_not_its_own_proc_read():
    from numaserve.config.schema import PoolConfig
    from numaserve.router.dispatch import Dispatcher
    from numaserve.router.status import instances

    gone = 2**22 + 7  # no such process: a /proc read would find nothing
    slot = instance("main-0", pid=gone, cpus=[3], nodes=[0], live_cpus=[3])
    dispatch = Dispatcher([PoolConfig(name="main", max_tokens=64)], queue_size=1)
    [entry] = instances(dispatch, (slot,))
    assert (entry.live_cpus, entry.affinity_ok) == ([3], True)


def test_the_status_says_what_runs_each_model_and_why():
    paths = {
        "toxicity": {
            "backend": "onnxruntime",
            "quantize": "int8",
            "keep_fp32": ["classifier"],
            "chosen_by": "config",
        },
        "embed": {
            "backend": "openvino",
            "quantize": "bf16",
            "keep_fp32": [],
            "chosen_by": "auto",
            "why": "the fastest that passes the gate: 6.04 ms a text",
        },
    }
    text = format_status(two_models(paths))  # embed's instance: routed by the other shard
    assert "model path of toxicity: onnxruntime int8 keep_fp32 classifier (as configured)" in text
    assert (
        "model path of embed: openvino bf16 (auto: the fastest that passes the gate: 6.04 ms a "
        "text)" in text
    )


def test_the_status_says_which_path_runs_a_pools_shorter_texts_and_what_a_named_int8_costs():
    paths = {
        "toxicity": {
            "backend": "torch",
            "quantize": "int8",
            "keep_fp32": [],
            "chosen_by": "config",
            "shorter": [],
            "accuracy": "served as asked; on this CPU below the gate's bar on texts of 1-8 tokens",
        },
        "embed": {
            "backend": "ctranslate2",
            "quantize": "int8",
            "keep_fp32": [],
            "chosen_by": "auto",
            "why": "texts of 9-256 tokens: the fastest",
            "shorter": [
                {
                    "last": 8,
                    "backend": "onnxruntime",
                    "quantize": "none",
                    "keep_fp32": [],
                    "why": "texts of 1-8 tokens: the fastest that passes the gate",
                }
            ],
        },
    }
    lines = format_status(two_models(paths)).splitlines()
    at = lines.index(
        "model path of embed: ctranslate2 int8 (auto: texts of 9-256 tokens: the fastest)"
    )
    assert lines[at + 1] == (
        "  texts of up to 8 tokens: onnxruntime none (auto: texts of 1-8 tokens: the fastest "
        "that passes the gate)"
    )
    at = lines.index("model path of toxicity: torch int8 (as configured)")
    assert lines[at + 1] == (
        "  accuracy: served as asked; on this CPU below the gate's bar on texts of 1-8 tokens"
    )


def test_the_status_says_what_binds_each_instances_memory():
    instances = [
        instance("main-0", membind="cpuset"),
        instance("main-1", membind="cpuset"),
        instance("long-0", membind="numactl"),
        instance("long-1"),  # not ready yet: nothing to say
    ]
    assert memory_lines(instances) == [
        "memory bound by cgroup cpuset.mems (memory-policy calls refused here): main-0, main-1",
        "memory bound by numactl --membind: long-0",
    ]


def test_the_status_says_each_nodes_shared_weights_and_how_many_instances_map_them():
    def on(node: int) -> list[dict]:
        return [
            {"file": f"/c/packed/node{node}/model.onnx.data", "bytes": 474_000_000, "node": node}
        ]

    instances = [
        instance("main-0", weights=on(0)),
        instance("main-1", weights=on(0)),
        instance("main-2", weights=on(1)),
        instance("cpu-0", weights=[]),  # torch: its weights in its own memory
        instance("cpu-1"),  # not ready yet: nothing to say
    ]
    assert weights_lines(instances) == [
        "weights on node 0: 474 MB, one copy mapped by 2 instance(s) "
        "(/c/packed/node0/model.onnx.data)",
        "weights on node 1: 474 MB, one copy mapped by 1 instance(s) "
        "(/c/packed/node1/model.onnx.data)",
        "weights in each instance's own memory: cpu-0",
    ]
