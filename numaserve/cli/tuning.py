"""`numaserve tune`: the pools, cores per instance and batching that serve a corpus best on
this machine (numaserve/tune), written as a config."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from numaserve.cli.common import HeldError, ModelError, UserError, config_option, main, read_machine
from numaserve.config.schema import ConfigError


@main.command()
@config_option
@click.option(
    "--corpus",
    required=True,
    type=click.Path(dir_okay=False),
    help="Texts like your traffic, one per line (their token lengths are what is tuned for).",
)
@click.option(
    "--p99-ms",
    type=click.FloatRange(min=1),
    default=100.0,
    show_default=True,
    help="The p99 latency target: the fastest configuration within it wins.",
)
@click.option(
    "--minutes",
    type=click.FloatRange(min=2),
    default=10.0,
    show_default=True,
    help="The time budget: about 40% measuring the model, the rest verifying real servers.",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, writable=True),
    help="Where to write the tuned config (YAML, commented with what was measured).",
)
def tune(config_path: str, corpus: str, p99_ms: float, minutes: float, out: str) -> None:
    """Measure the model on this machine's cores and search pools, cores per instance,
    instances and batching for the most throughput within --p99-ms on --corpus; verify the
    best few and the config as given as real servers; write the winner to --out.

    Runs where the server will run, with no server of the same cores running: it plans
    around other numaserve servers' cores (the ledger), and stops everything it started on
    any exit."""
    from numaserve.loadgen.bench import CorpusError, load_corpus
    from numaserve.processes.logs import setup_logging
    from numaserve.tune.measure import MeasureError
    from numaserve.tune.run import NoCoresError, NoModelError, TuneError
    from numaserve.tune.run import tune as run_tune

    setup_logging("warning")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: probes, servers stop
    try:
        texts = load_corpus(corpus)
        outcome = run_tune(
            config_path,
            texts,
            read_machine(None, None),
            p99_ms,
            minutes,
            Path(out),
            lambda line: click.echo(line, err=True),
        )
    except (ConfigError, CorpusError) as e:
        raise UserError(str(e)) from None
    except NoCoresError as e:
        raise HeldError(str(e)) from None
    except NoModelError as e:
        raise ModelError(str(e)) from None
    except (TuneError, MeasureError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(outcome.table)
    click.echo(f"wrote {outcome.out}: {outcome.chosen}")
