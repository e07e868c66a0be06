"""What a front says of a model it serves, whatever the transport: TEI's `Info` (its
checkpoint, what `numaserve prepare` resolved for it on this CPU, the server's limits) and a
classifier's label names."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from numaserve import __version__
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.files import read_json
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.config.paths import ModelPath
from numaserve.processes.prepared import Prepared
from numaserve.processes.specs import FrontModel

if TYPE_CHECKING:
    from numaserve.front.core import Core

# model.quantize in TEI's words; `auto` is decided per CPU at prepare (`numaserve status`).
DTYPES = {"none": "float32", "bf16": "bfloat16", "int8": "int8", "int16": "int16", "auto": "auto"}


def prepared(model: FrontModel) -> Prepared | None:
    """What `numaserve prepare` resolved for the model (processes/prepared.py's record): None
    where nothing was prepared or it cannot be read."""
    try:
        return Prepared.read(model.prepared) if model.prepared else None
    except ModelLoadError:
        return None


def _words(path: ModelPath) -> str:
    """A model path as /info names it: its backend and precision."""
    return f"{path.backend} {path.quantize}"


def info(core: Core, model: FrontModel) -> dict:
    """TEI's Info of `model`, with numaserve's own keys beside TEI's."""
    settings, server = model.model, core.spec.server
    record = prepared(model)
    pools = record.pools if record else {}
    every = [path for p in pools.values() for path, _ in p.paths]
    dtypes = sorted({DTYPES[p.quantize] for p in every}) or [DTYPES[settings.quantize]]
    return {
        "model_id": settings.path,
        "model_sha": record.digest if record else None,  # the checkpoint's files
        "model_dtype": ",".join(dtypes),  # each path's, where they differ
        "model_paths": {pool: _words(p.path) for pool, p in pools.items()},
        # A pool's shorter texts on paths of their own (quantize: auto), and what a
        # precision the config names costs on this CPU (the accuracy gate's verdicts).
        "model_paths_shorter": {
            pool: [{"last_tokens": b.last, "path": _words(b.path)} for b in p.shorter]
            for pool, p in pools.items()
            if p.shorter
        },
        # A band's micro-batches from `from_batch` texts on (`last_tokens`: the band's
        # longest; null: the pool's own band), where another path is faster there.
        "model_paths_batched": {
            pool: [
                {
                    "last_tokens": getattr(b, "last", None),
                    "from_batch": batched.from_batch,
                    "path": _words(batched.path),
                }
                for b in p.bands
                if (batched := b.batched)
            ]
            for pool, p in pools.items()
            if any(b.batched for b in p.bands)
        },
        # Each path a pool holds, for the texts it runs, with the accuracy gate's figures
        # on this CPU in each band of lengths (auto's, or what a named precision costs).
        "model_accuracy": {
            pool: judged
            for pool, p in pools.items()
            if (
                judged := [
                    {"last_tokens": n, "from_batch": b, "path": _words(path), "accuracy": a}
                    for n, b, path, a in p.by_band
                    if a
                ]
            )
        },
        "model_type": model_type(model),
        "served_model_name": model.name,
        "max_concurrent_requests": server.queue_size,
        "max_input_length": settings.max_length,
        "max_batch_tokens": server.max_batch_tokens,
        "max_batch_requests": server.max_batch,
        "max_client_batch_size": server.max_texts,
        "auto_truncate": settings.truncate,
        "tokenization_workers": len(model.shards),
        "version": __version__,
        "sha": None,
        "docker_label": None,
    }


def model_type(model: FrontModel) -> dict:
    task, path = model.model.task, model.model.path
    if task == "embed":
        from numaserve.tasks.pooling import Pooling

        return {"embedding": {"pooling": "+".join(Pooling.read(resolve_model_path(path)).modes)}}
    if task == "multivector":  # a vector per token: none pooled
        return {"embedding": {"pooling": "multivector"}}
    names = labels(path)
    id2label = {str(i): name for i, name in enumerate(names)}
    kinds = {"rerank": "reranker"}
    return {
        kinds.get(task, "classifier"): {
            "id2label": id2label,
            "label2id": {n: i for i, n in enumerate(names)},
        }
    }


def predictions(path: str, scores) -> list[tuple[str, float]]:
    """A classifier's scores of one text as TEI lists them: (label, score), best first; a
    label its config.json does not name is LABEL_i."""
    names = labels(path)
    named = [(names[i] if i < len(names) else f"LABEL_{i}", s) for i, s in enumerate(scores)]
    return sorted(named, key=lambda p: -p[1])


@cache
def labels(path: str) -> tuple[str, ...]:
    """A classifier's label names, in its output order (config.json's id2label)."""
    raw = read_json(Path(resolve_model_path(path)) / "config.json").get("id2label") or {}
    return tuple(str(raw[k]) for k in sorted(raw, key=int))
