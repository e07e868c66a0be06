"""One plan over several models (`models:`): the same rules as for one, across the host."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numaserve.config.schema import AUTO, PlacementConfig, PoolConfig, ServedModel, parse_config
from numaserve.host.placement import PlacementError, format_plan, plan_placement, replan
from numaserve.host.topology import read_topology
from tests.test_placement import topologies

RESERVE_2 = PlacementConfig(reserved_cores=2)


def model(name: str, *pools: tuple[int, int | str], weight: int = 1) -> ServedModel:
    """`pools`: (cores_per_instance, instances) of each of the model's pools."""
    return ServedModel(
        name=name,
        weight=weight,
        pools=tuple(
            PoolConfig(name=f"p{i}", max_tokens=64 * (i + 1), cores_per_instance=c, instances=n)
            for i, (c, n) in enumerate(pools)
        ),
    )


def cores_of(topo, plan) -> dict[str, list[int]]:
    """Each model's physical cores (their lowest thread ids), as many times as it has them."""
    core_of = {cpu: core.id for core in topo.cores for cpu in core.cpus}
    held: dict[str, list[int]] = {}
    for slot in plan.slots:
        held.setdefault(slot.model, []).extend({core_of[c] for c in slot.cpus})
    return held


def test_no_physical_core_is_in_two_instances_of_any_model(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    models = (model("toxicity", (1, 4), (2, AUTO)), model("embed", (4, 2), (1, AUTO)))

    plan = plan_placement(topo, PlacementConfig(reserved_cores=2, smt=True), models)

    cores = [core for held in cores_of(topo, plan).values() for core in held]
    assert len(cores) == len(set(cores))
    assert not {cpu for s in plan.slots for cpu in s.cpus} & set(plan.reserved_cpus)
    assert Counter((s.model, s.pool) for s in plan.slots)[("toxicity", "p0")] == 4
    assert Counter((s.model, s.pool) for s in plan.slots)[("embed", "p0")] == 2


def test_instances_are_named_for_their_model_and_pool(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))

    plan = plan_placement(topo, RESERVE_2, (model("toxicity", (1, 2)), model("embed", (1, 1))))

    assert [s.name for s in plan.slots] == ["toxicity.p0-0", "toxicity.p0-1", "embed.p0-0"]
    assert [s.model for s in plan.slots] == ["toxicity", "toxicity", "embed"]
    assert plan.models == ("toxicity", "embed")


def test_auto_pools_share_the_free_cores_by_weight(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))  # 48 cores, 2 reserved: 23 free per node
    models = (model("small", (1, AUTO), weight=1), model("large", (1, AUTO), weight=3))

    plan = plan_placement(topo, RESERVE_2, models)

    held = {name: len(cores) for name, cores in cores_of(topo, plan).items()}
    assert held["small"] + held["large"] == 46  # every free core is used
    assert abs(held["large"] - 3 * held["small"]) <= 4  # 3:1, to an instance per node


def test_equal_weights_by_default_share_equally(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))

    plan = plan_placement(topo, RESERVE_2, (model("a", (1, AUTO)), model("b", (1, AUTO))))

    held = cores_of(topo, plan)
    assert abs(len(held["a"]) - len(held["b"])) <= 2


def test_every_model_has_its_share_of_every_node(sysfs):
    """Each model's router shard on a node has that node's instances to route to."""
    topo = read_topology(sysfs("xeon8260_2socket"))
    models = (model("small", (1, AUTO), weight=1), model("large", (2, AUTO), weight=3))

    plan = plan_placement(topo, RESERVE_2, models)

    per_node = Counter((s.model, s.node) for s in plan.slots)
    assert per_node[("small", 0)] == per_node[("small", 1)] > 0
    assert per_node[("large", 0)] == per_node[("large", 1)] > 0


def test_fixed_pools_of_every_model_are_placed_before_any_auto(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    models = (model("embed", (1, AUTO)), model("ner", (8, 2)))

    plan = plan_placement(topo, RESERVE_2, models)

    assert Counter(s.model for s in plan.slots)["ner"] == 2
    assert len(cores_of(topo, plan)["embed"]) == 46 - 16


def test_a_plan_that_does_not_fit_says_what_each_model_asked_for(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    models = (model("toxicity", (1, 40)), model("embed", (8, 2)), model("ner", (4, AUTO)))

    with pytest.raises(PlacementError) as caught:
        plan_placement(topo, PlacementConfig(), models)

    message = str(caught.value)
    assert "pool 'toxicity.p0' asks for 40 instance(s)" in message
    assert "32 are free for it" in message and "placing pools 'embed.p0' (2)" in message
    assert (
        "The models ask for: toxicity: p0 40 x 1 core(s); embed: p0 2 x 8 core(s); "
        "ner: p0 auto x 4 core(s) (weight 1)" in message
    )


def test_an_auto_pool_left_no_room_names_its_weight(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    models = (model("toxicity", (1, 46)), model("a", (1, AUTO)), model("b", (4, AUTO), weight=2))

    with pytest.raises(PlacementError, match=r"pool 'b.p0' \(instances: auto, weight 2 of 3\)"):
        plan_placement(topo, PlacementConfig(), models)


def test_one_model_plans_exactly_as_a_model_config_does(sysfs):
    """`model:` is one model named `default`: the same slots, names and CPUs as ever."""
    topo = read_topology(sysfs("xeon8260_2socket"))
    single = parse_config(
        "model: {max_length: 128}\nplacement: {reserved_cores: 2, pools: "
        "[{name: short, max_tokens: 64, instances: 4}, {name: long, max_tokens: 128}]}"
    )

    as_config = plan_placement(topo, single.placement, single.models, single.named)
    as_before = plan_placement(topo, single.placement)

    assert [m.name for m in single.models] == ["default"] and not single.named
    assert as_config == as_before
    assert [s.name for s in as_before.slots][:5] == [*(f"short-{i}" for i in range(4)), "long-0"]
    assert {s.model for s in as_before.slots} == {"default"}


def test_a_models_list_of_one_still_names_instances_for_their_model(sysfs):
    """So that a reload may add a model beside it without renaming anything."""
    topo = read_topology(sysfs("xeon8260_2socket"))

    plan = plan_placement(topo, RESERVE_2, (model("embed", (1, 2)),))

    assert [s.name for s in plan.slots] == ["embed.p0-0", "embed.p0-1"]


def test_the_plan_table_shows_each_instances_model(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))

    table = format_plan(plan_placement(topo, RESERVE_2, (model("a", (1, 1)), model("b", (1, 1)))))

    assert table.splitlines()[0].split() == ["instance", "model", "pool", "node", "threads", "cpus"]
    assert table.splitlines()[1].split()[:2] == ["a.p0-0", "a"]


@st.composite
def several_models(draw):
    count = draw(st.integers(2, 3))
    models = []
    for m in range(count):
        fixed = draw(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3)), max_size=2))
        auto = [(draw(st.integers(1, 3)), AUTO)] if draw(st.booleans()) or not fixed else []
        models.append(model(f"m{m}", *fixed, *auto, weight=draw(st.integers(1, 4))))
    return tuple(models)


@settings(max_examples=300, deadline=None)
@given(topo=topologies(), models=several_models(), reserved=st.integers(0, 2))
def test_every_plan_of_several_models_shares_no_core_or_explains_why_not(topo, models, reserved):
    placement = PlacementConfig(reserved_cores=reserved)
    try:
        plan = plan_placement(topo, placement, models)
    except PlacementError as e:
        assert "Would fit:" in str(e) or "no allowed CPUs" in str(e)
        return
    core_of = {cpu: core.id for core in topo.cores for cpu in core.cpus}
    cores = [core_of[c] for s in plan.slots for c in s.cpus]
    assert len(cores) == len(set(cores))
    assert set(cores).isdisjoint(core_of[c] for c in plan.reserved_cpus)
    for m in models:
        for pool in m.pools:
            placed = [s for s in plan.slots if (s.model, s.pool) == (m.name, pool.name)]
            assert placed  # every pool of every model has an instance
            if pool.instances != AUTO:
                assert len(placed) == pool.instances


# -- a reload that adds and removes models (replan) -----------------------------------------


def test_a_reload_keeps_every_kept_models_instances_where_they_are(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    before = plan_placement(topo, RESERVE_2, (model("a", (1, 12)), model("b", (2, 4))))
    models = (model("a", (1, AUTO)), model("b", (2, 4)), model("c", (1, 3)))
    kept = {s.name: s for s in before.slots}

    after = replan(before, topo, RESERVE_2, models)

    assert [s for s in after.slots if s.model != "c"] == list(kept.values())
    assert after.reserved_cpus == before.reserved_cpus


def test_an_added_model_takes_only_whole_cores_nobody_holds(sysfs):
    """SMT on: an added instance must not get the idle sibling of a kept instance's core."""
    topo = read_topology(sysfs("xeon8260_2socket"))
    placement = PlacementConfig(reserved_cores=2, smt=False)
    before = plan_placement(topo, placement, (model("a", (1, 10)),))
    models = (model("a", (1, 10)), model("c", (1, AUTO)))

    after = replan(before, topo, placement, models)

    cores = [core for held in cores_of(topo, after).values() for core in held]
    reserved = {c.id for c in topo.cores if set(c.cpus) & set(before.reserved_cpus)}
    assert len(cores) == len(set(cores)) and not reserved & set(cores)
    assert Counter(s.model for s in after.slots)["c"] == 48 - 2 - 10


def test_a_removed_models_cores_go_to_the_added_one(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    before = plan_placement(topo, RESERVE_2, (model("a", (1, 20)), model("b", (1, AUTO))))
    b_cores = set(cores_of(topo, before)["b"])

    after = replan(before, topo, RESERVE_2, (model("a", (1, 20)), model("c", (1, AUTO))))

    assert "b" not in after.models
    assert set(cores_of(topo, after)["c"]) == b_cores
    assert after.models == ("a", "c")


def test_an_added_model_that_does_not_fit_says_which_and_why(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    before = plan_placement(topo, RESERVE_2, (model("a", (1, AUTO)),))

    with pytest.raises(
        PlacementError, match=r"added model\(s\) c do not fit .* leave free: no allowed CPUs"
    ):
        replan(before, topo, RESERVE_2, (model("a", (1, AUTO)), model("c", (1, 1))))
