"""What `numaserve status` and the probes read of the whole server: the shards' statuses
merged into one (`merge.py`)."""
