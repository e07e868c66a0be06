"""numaserve: BERT-like models served from many pinned, NUMA-local CPU instances."""

import os

__version__ = "0.1.0"

# No numaserve process opens a connection off the host. ONNX Runtime sends usage events to
# its vendor from every process that loads it (seen with strace: DNS lookups for an events
# host every few seconds); the Hugging Face libraries report usage too. Every process that
# imports numaserve switches them off before they can load, and its children inherit it.
# A hub id in model.path is read from the local Hugging Face cache, never fetched.
OFFLINE_ENV = {
    "ORT_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
}
os.environ.update(OFFLINE_ENV)
