"""Runs a Plan as processes and keeps them running (docs/architecture.md, "supervisor/").

Ownership is the rule: the arbiter alone holds and writes the server's state, each child
alone writes its own, and every other module decides and returns actions. Its modules:

- `arbiter.py`: the `Supervisor` and its one loop (after gunicorn's arbiter): signals that
  only enqueue, spawning and reaping, which children run (its roster, changed here alone),
  the server's phase (`enter`, the one way it changes), status questions (the control
  socket's and those a shard passes on, one road), and `carry_out`, the one place actions
  take effect;
- `phase.py`: the server's phase, one value (preparing, starting, serving, reloading,
  stopping, ...), each holding what only it needs, changed only along its table;
- `roster.py`: every child, once, by the kind it knows: the running shape and the retired
  still to be reaped, which every "all the fronts", "all the workers" reads;
- `children.py`: a `Child`, one process, and its state machine (after supervisord: STARTING,
  READY, DRAINING, STOPPED, BACKOFF, FATAL; `change_state` the one way a state changes), its
  spec, timers and restart policy;
- `liveness.py`: which of a child's judgements applies each turn (ready, silent, late to stop,
  due to restart), and whether the server can still serve;
- `rollout.py`: the next steps of a start or a reload toward the wanted deployment, its
  progress read from what runs, by value;
- `reload.py`: what a SIGHUP wants (the config read again, models added, removed and kept,
  the slots to renew);
- `stop.py`: a stop's order (the fronts, then shards, then the rest; a second SIGINT kills);
- `reporting.py`: the server's one `Mood`, the line systemd shows and when it hears it, and
  the snapshot /metrics reads;
- `start.py`: `numaserve start` around the loop (the plan, the ledger entry, the control
  socket, the metrics endpoint);
- its edges to the world: `processes.py` (processes, signals, files, the clock),
  `router_link.py` (the router shards' worker sockets: slot tables and status),
  `control.py` (the control socket `numaserve status` and `stop` ask), `sdnotify.py` (systemd).

Nothing here imports the router or a model runtime: the children are started by their command
lines (processes/specs.py), and the model is prepared by running `numaserve prepare` as a child.
"""
