"""PyLate's own encode of documents, for benchmarks/colbert.py: run by the Python of PyLate's
environment (benchmarks/peer_apps/install.sh, .peers/pylate), which imports nothing of
numaserve's. Reads {"backbone", "dim", "document_length", "documents", "seconds"} as JSON on
stdin; prints {"documents_a_second"}: encode(is_query=False, batch 32) over the documents,
in turns, for `seconds`, on every allowed core, the model's load left out of the time."""

import json
import os
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"  # before PyLate loads: nothing is fetched
os.environ["TRANSFORMERS_OFFLINE"] = "1"


def main() -> None:
    import torch
    from pylate import models

    asked = json.load(sys.stdin)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    model = models.ColBERT(
        model_name_or_path=asked["backbone"],
        embedding_size=asked["dim"],
        document_length=asked["document_length"],
        device="cpu",
    )
    docs = asked["documents"]
    model.encode(docs[:32], is_query=False, batch_size=32, show_progress_bar=False)  # warm
    count, began = 0, time.monotonic()
    while time.monotonic() - began < asked["seconds"]:
        start = (count * 32) % (len(docs) - 32)
        model.encode(
            docs[start : start + 32], is_query=False, batch_size=32, show_progress_bar=False
        )
        count += 32
    print(json.dumps({"documents_a_second": count / (time.monotonic() - began)}))


if __name__ == "__main__":
    main()
