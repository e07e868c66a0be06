"""The server's status as typed records, each with one owner and one wire form:

- `report.py`: the supervisor's `SlotTable` (a `SlotEntry` per slot), a shard's `ShardReport`
  (a `Routing` per process it hears, with its `RunningPath`), and the whole server's
  `ServerReport`, the `status` op's answer;
- `merge.py`: the one place a slot is joined with its routing shard's view and the shards'
  parts are summed;
- `format.py`: `numaserve status` as a person reads it.
"""
