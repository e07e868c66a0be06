"""numaserve: BERT-like models served from many pinned, NUMA-local CPU instances."""

import os

__version__ = "0.1.0"

# No numaserve process opens a connection off the host. ONNX Runtime sends usage events to
# its vendor from every process that loads it (seen with strace: DNS lookups for an events
# host every few seconds); the Hugging Face libraries report usage too. Every process that
# imports numaserve switches them off before they can load, and its children inherit it.
# (Not HF_HUB_OFFLINE: a service that imports numaserve's client may call the hub or TEI with
# huggingface_hub. A hub id in model.path is found with local_files_only, never fetched.)
OFFLINE_ENV = {
    "ORT_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
}
os.environ.update(OFFLINE_ENV)
