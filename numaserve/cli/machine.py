"""The commands that read the machine: topology, plan."""

from __future__ import annotations

import click

from numaserve.cli.common import (
    UserError,
    allowed_mems_option,
    allowed_option,
    config_option,
    json_option,
    main,
    model_problems,
    print_json,
    read_machine,
    sysfs_option,
)
from numaserve.config.schema import ConfigError, load_config
from numaserve.host.ledger import Ledger, ledger_dir, plan_around
from numaserve.host.placement import PlacementError, format_plan
from numaserve.host.shards import plan_model_shards
from numaserve.host.topology import format_topology


def _ledger() -> Ledger | None:
    """This host's core ledger, read only: a command that shows things creates nothing."""
    directory = ledger_dir(create=False)
    return Ledger(directory) if directory else None


@main.command()
@sysfs_option
@allowed_option
@allowed_mems_option
@json_option
def topology(
    sysfs_root: str | None, allowed_cpus: str | None, allowed_mems: str | None, as_json: bool
) -> None:
    """Show sockets, NUMA nodes, physical cores, their types and hardware threads."""
    topo = read_machine(sysfs_root, allowed_cpus, allowed_mems)
    ledger = None if sysfs_root else _ledger()
    holders = ledger.holders() if ledger else []
    if as_json:
        held = [h.to_json() for h in holders]
        print_json({**topo.to_json(), "held": held})
    else:
        held = [f"held by another numaserve server: {h.describe()}" for h in holders]
        click.echo("\n".join([format_topology(topo), *held]))


@main.command()
@config_option
@sysfs_option
@allowed_option
@allowed_mems_option
@json_option
def plan(
    config_path: str,
    sysfs_root: str | None,
    allowed_cpus: str | None,
    allowed_mems: str | None,
    as_json: bool,
) -> None:
    """Show where each instance and router shard of CONFIG would run, without starting anything."""
    try:
        config = load_config(config_path)
    except ConfigError as e:
        raise UserError(str(e)) from None
    topo = read_machine(sysfs_root, allowed_cpus, allowed_mems)
    for warning in topo.warnings:
        click.echo(f"warning: {warning}", err=True)
    problems = model_problems(config)
    if problems and not sysfs_root:
        raise UserError("; ".join(problems))
    for problem in problems:  # a plan for another machine, whose models may be there
        click.echo(f"warning: {problem}", err=True)
    ledger = None if sysfs_root else _ledger()  # other servers run on this machine only
    serving = ledger.serving(config_path) if ledger else None  # this config, running now
    try:
        topo, result, holders = plan_around(
            ledger, topo, config.placement, config.models, config.named, serving
        )
        shards = plan_model_shards(result, topo, config.server.routers)
    except PlacementError as e:
        raise UserError(f"{config_path}: cannot place: {e}") from None
    if as_json:
        routers = [{"model": model, **shard.to_json()} for model, shard in shards]
        held = [h.to_json() for h in holders]
        served = serving.to_json() if serving else None
        print_json({**result.to_json(), "routers": routers, "held": held, "served_by": served})
    else:
        several = len(result.models) > 1
        routers = [f"{model}: " * several + shard.describe() for model, shard in shards]
        around = [f"planned around another server: {h.describe()}" for h in holders]
        if serving:  # its plan, not "no allowed CPUs": its own cores count as free
            around.append(
                f"served now by pid {serving.pid}, on CPUs {serving.cpus}: the "
                "plan above counts them free; `numaserve status` shows where it runs"
            )
        click.echo("\n".join([format_plan(result), *routers, *around]))
