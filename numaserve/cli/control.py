"""How `numaserve status` and `numaserve stop` reach a server on this host: its supervisor's
control socket, found in the host's ledger by the endpoint it serves (host/ledger.py,
wire/control.py); not through a router shard, as a client would."""

from __future__ import annotations

from numaserve.cli.common import MachineError
from numaserve.host.ledger import LEDGER_ENV, SYSTEM_DIR, Holder, Ledger, ledger_dir
from numaserve.wire.control import ControlConnection, ControlError


def local_server(endpoints) -> Holder | None:
    """The server on this host that a client of `endpoints` reaches, where its ledger entry
    names a control socket; None for a remote one, or a server with no ledger entry."""
    directory = ledger_dir(create=False)
    if directory is None:
        return None
    ledger = Ledger(directory)
    for endpoint in endpoints:
        holder = ledger.serving_at(endpoint)
        if holder is not None and holder.control:
            return holder
    return None


def no_local_server(endpoints) -> MachineError:
    """What stop says where no server on this host serves `endpoints`: what serves here."""
    asked = " ".join(endpoints)
    directory = ledger_dir(create=False)
    if directory is None:
        return MachineError(
            f"no numaserve server on this host serves {asked}: there is no ledger here "
            f"(${LEDGER_ENV}, {SYSTEM_DIR} or $XDG_RUNTIME_DIR/numaserve) to find one in. "
            "Run `numaserve stop` on the server's own host, with its environment (nothing was "
            "stopped)"
        )
    servers = "; ".join(
        f"pid {h.pid} serves {h.endpoint or '(no endpoint recorded)'}"
        for h in Ledger(directory).holders()
    )
    return MachineError(
        f"no numaserve server on this host serves {asked} (the ledger {directory} lists "
        f"{servers or 'none'}). Run `numaserve stop` on the server's own host (nothing was "
        "stopped)"
    )


def connect(holder: Holder, timeout: float) -> ControlConnection:
    try:
        return ControlConnection(holder.control, timeout)
    except ControlError as e:
        raise MachineError(f"the server of pid {holder.pid}: {e}") from None
