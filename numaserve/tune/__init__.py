"""`numaserve tune`: the pools, cores per instance and batching that serve a workload best here.

`workload.py` reads the corpus's token lengths; `curves.py` holds the model's measured batch
times (`probe.py` measures them in pinned processes, `measure.py` schedules those); `search.py`
predicts each configuration's throughput and p99 from them, pure; `verify.py` runs the best few
and the default as real servers under `numaserve bench`'s load; `tuned.py` writes the result;
`report.py` says the winner and writes the file's head; `run.py` is the whole run within its
time budget.
"""
