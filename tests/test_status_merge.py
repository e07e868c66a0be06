"""The whole server's status (status/merge.py: each slot joined with its routing shard's
view), and the table a person reads (status/format.py): pure, on hand-made records."""

from dataclasses import replace

from numaserve.config.paths import BandPath, BatchedPath, ModelPath, PoolPath
from numaserve.host.cpuset import CPUSet
from numaserve.status.format import format_status, memory_lines, weights_lines
from numaserve.status.merge import server_report
from numaserve.status.report import RunningPath, ServerReport, SlotTable, SupervisorInfo
from tests.harness.reports import instance, report, routing, slot


def shard(n: int, routed: list, model: str = "default"):
    return report(n, tuple(routed), model_name=model, requests={"ok": 0})


def test_each_slot_shows_the_supervisors_state_and_the_routing_of_the_shard_that_hears_it():
    slots = [slot("main-0", shard=0, pid=10), slot("main-1", shard=1, pid=11)]
    shards = [shard(1, [routing("main-1", 11, served=4)]), shard(0, [routing("main-0", 10)])]
    whole = {i.slot.name: i for i in server_report(slots, None, shards).instances}
    assert whole["main-0"].slot.state == whole["main-1"].slot.state == "ready"
    assert whole["main-0"].routed and whole["main-1"].routed
    assert whole["main-1"].routing.served == 4


def test_a_shards_view_of_an_older_process_in_the_slot_is_not_taken_for_the_new_one():
    slots = [slot("main-0", shard=0, pid=20, state="starting")]
    peer = shard(0, [routing("main-0", 10)])  # the pid before a restart
    (main0,) = server_report(slots, None, [peer]).instances
    assert main0.slot.pid == 20 and main0.slot.state == "starting" and not main0.routed


def test_the_whole_servers_status_reads_back_from_its_wire_form_as_it_was():
    slots = [slot("main-0", shard=0, pid=10, cpus=[1], live_cpus=[1], restarts=0)]
    path = RunningPath(PoolPath(ModelPath("onnxruntime", "int8")), "config")
    seen = routing("main-0", 10, membind="numactl", weights=[], served=3)
    seen = type(seen).from_wire(seen.to_wire() | {"model_path": path.to_wire()})
    whole = server_report(slots, SupervisorInfo(pid=1, state="ready"), [shard(0, [seen])])
    assert ServerReport.from_wire(whole.to_wire()) == whole
    assert whole.to_wire()["instances"][0]["affinity_ok"] is True


def two_models(paths: dict[str, RunningPath] | None = None):
    """Shard 0 routes to toxicity's instance, shard 1 to embed's; both pools are `main`.
    `paths`: each model's model path, as the shard that routes its instance knows it."""
    slots = [
        slot(name, shard=n, pid=10 + n, model_name=model, cpus=[n], nodes=[0])
        for n, (name, model) in enumerate(
            (("toxicity.main-0", "toxicity"), ("embed.main-0", "embed"))
        )
    ]
    said = {
        s.model_name: (paths or {}).get(s.model_name) for s in slots
    }  # as their READY said them
    shards = [
        shard(s.shard, [routing_said(s.name, s.pid, said[s.model_name])], s.model_name)
        for s in slots
    ]
    return server_report(slots, None, shards)


def routing_said(name: str, pid: int, path: RunningPath | None):
    """A shard's view of a process whose READY said `path`, read as the shard reads it."""
    seen = routing(name, pid)
    return type(seen).from_wire(seen.to_wire() | {"model_path": path and path.to_wire()})


def test_pools_of_the_same_name_in_two_models_are_two_pools():
    pools = two_models().pools
    assert [(p.model_name, p.name, p.ready) for p in pools] == [
        ("toxicity", "main", 1),
        ("embed", "main", 1),
    ]


def test_the_status_table_names_each_instances_model_and_each_pools():
    lines = format_status(two_models()).splitlines()
    assert lines[0].split()[:3] == ["instance", "model", "pool"]
    assert lines[1].split()[:3] == ["embed.main-0", "embed", "main"]  # by name
    assert lines[2].split()[:3] == ["toxicity.main-0", "toxicity", "main"]
    assert "pools: toxicity.main (<= 64 tokens): 0 queued, 1 ready, embed.main" in "\n".join(lines)
    assert any(line.startswith("router shard 1 of embed (CPUs 1)") for line in lines)


def test_a_supervised_shard_answering_alone_shows_the_affinity_the_supervisor_read():
    from numaserve.config.schema import PoolConfig
    from numaserve.router.dispatch import Dispatcher
    from numaserve.router.status import answered_alone

    gone = 2**22 + 7  # no such process: a /proc read would find nothing
    table = SlotTable(
        SupervisorInfo(pid=1),
        (slot("main-0", pid=gone, cpus=[3], nodes=[0], live_cpus=[3]),),
        routers=((0, "ready"),),
    )
    dispatch = Dispatcher([PoolConfig(name="main", max_tokens=64)], queue_size=1)
    (entry,) = answered_alone(report(), dispatch, table).instances
    assert (entry.slot.live_cpus, entry.slot.affinity_ok) == (CPUSet.of([3]), True)


def test_the_status_says_what_runs_each_model_and_why():
    paths = {
        "toxicity": RunningPath(
            PoolPath(ModelPath("onnxruntime", "int8", ("classifier",))), "config"
        ),
        "embed": RunningPath(
            PoolPath(
                ModelPath("openvino", "bf16"), "the fastest that passes the gate: 6.04 ms a text"
            ),
            "auto",
        ),
    }
    text = format_status(two_models(paths))  # embed's instance: routed by the other shard
    assert "model path of toxicity: onnxruntime int8 keep_fp32 classifier (as configured)" in text
    assert (
        "model path of embed: openvino bf16 (auto: the fastest that passes the gate: 6.04 ms a "
        "text)" in text
    )


def test_the_status_says_which_path_runs_a_pools_shorter_texts_and_what_a_named_int8_costs():
    named = "served as asked; on this CPU below the gate's bar on texts of 1-8 tokens"
    shorter = BandPath(
        8, ModelPath("onnxruntime", "none"), "texts of 1-8 tokens: the fastest that passes the gate"
    )
    paths = {
        "toxicity": RunningPath(PoolPath(ModelPath("torch", "int8"), accuracy=named), "config"),
        "embed": RunningPath(
            PoolPath(
                ModelPath("ctranslate2", "int8"), "texts of 9-256 tokens: the fastest", (shorter,)
            ),
            "auto",
        ),
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


def test_the_status_says_which_path_runs_each_bands_micro_batches_and_the_passes_each_ran():
    switch = BatchedPath(4, ModelPath("openvino", "bf16"), "texts of 9-16 tokens, 8 a batch: 1.47x")
    shorter = BandPath(
        16,
        ModelPath("ctranslate2", "int16"),
        "texts of 1-16 tokens, one at a time: the fastest",
        switch,
    )
    embed = RunningPath(
        PoolPath(
            ModelPath("ctranslate2", "int8"), "texts of 17-256 tokens: the fastest", (shorter,)
        ),
        "auto",
    )
    slots = [slot("embed.main-0", shard=0, pid=10, model_name="embed", cpus=[0], nodes=[0])]
    seen = routing_said("embed.main-0", 10, embed)
    counted = replace(seen, passes={"ctranslate2 int16": 7, "openvino bf16": 3})
    report = server_report(slots, None, [shard(0, [counted], "embed")])
    lines = format_status(report).splitlines()
    at = lines.index(
        "  texts of up to 16 tokens: ctranslate2 int16 (auto: texts of 1-16 tokens, one "
        "at a time: the fastest)"
    )
    assert lines[at + 1] == (
        "    micro-batches of 4 texts or more: openvino bf16 (auto: texts of 9-16 tokens, 8 a "
        "batch: 1.47x)"
    )
    assert lines[at + 2] == "  forward passes, every instance: ctranslate2 int16 7, openvino bf16 3"


def test_the_status_shows_every_path_a_pool_holds_with_the_gates_figures_where_it_runs():
    switch = BatchedPath(
        4, ModelPath("openvino", "bf16"), "8 a batch: 1.47x", "9-16 tokens: 100% at cosine >= 0.99"
    )
    shorter = BandPath(
        16,
        ModelPath("ctranslate2", "int16"),
        "one at a time: the fastest",
        switch,
        "1-8 tokens: 99.8%; 9-16 tokens: 100%",
    )
    embed = RunningPath(
        PoolPath(
            ModelPath("ctranslate2", "int8"),
            "the fastest",
            (shorter,),
            accuracy="17-64 tokens: 99.6%; 65-512 tokens: 100%",
        ),
        "auto",
    )
    slots = [slot("embed.main-0", shard=0, pid=10, model_name="embed", cpus=[0], nodes=[0])]
    report = server_report(
        slots, None, [shard(0, [routing_said("embed.main-0", 10, embed)], "embed")]
    )
    lines = format_status(report).splitlines()
    at = lines.index("model path: ctranslate2 int8 (auto: the fastest)")
    assert lines[at : at + 5] == [
        "model path: ctranslate2 int8 (auto: the fastest)",
        "  accuracy: 17-64 tokens: 99.6%; 65-512 tokens: 100%",
        "  texts of up to 16 tokens: ctranslate2 int16 (auto: one at a time: the fastest)",
        "    accuracy: 1-8 tokens: 99.8%; 9-16 tokens: 100%",
        "    micro-batches of 4 texts or more: openvino bf16 (auto: 8 a batch: 1.47x)",
    ]
    assert lines[at + 5] == "      accuracy: 9-16 tokens: 100% at cosine >= 0.99"


def test_the_status_says_what_binds_each_instances_memory():
    instances = [
        instance("main-0", {"membind": "cpuset"}),
        instance("main-1", {"membind": "cpuset"}),
        instance("long-0", {"membind": "numactl"}),
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
        instance("main-0", {"weights": on(0)}),
        instance("main-1", {"weights": on(0)}),
        instance("main-2", {"weights": on(1)}),
        instance("cpu-0", {"weights": []}),  # torch: its weights in its own memory
        instance("cpu-1"),  # not ready yet: nothing to say
    ]
    assert weights_lines(instances) == [
        "weights on node 0: 474 MB, one copy mapped by 2 instance(s) "
        "(/c/packed/node0/model.onnx.data)",
        "weights on node 1: 474 MB, one copy mapped by 1 instance(s) "
        "(/c/packed/node1/model.onnx.data)",
        "weights in each instance's own memory: cpu-0",
    ]
