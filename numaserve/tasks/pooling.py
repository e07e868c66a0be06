"""How an embedding model turns its token vectors into one vector: as its sentence-transformers
modules say (modules.json, NAME/config.json), computed as sentence-transformers computes it.

A checkpoint without modules.json (a plain transformers model) gets the mean of its tokens,
made unit length: what numaserve has always served. A module numaserve cannot run (a Dense
layer, say) is refused at start, by name: serving the vectors without it would be wrong with
no error at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from numaserve.config.model_paths import ModelLoadError, read_json

# sentence-transformers' names, in the order it concatenates them.
MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
LEGACY_KEYS = {  # its config files before v5: one boolean per mode
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# The module types numaserve runs, by class name (their module path moved between versions:
# sentence_transformers.models.Pooling, ...sentence_transformer.modules.pooling.Pooling).
TRANSFORMER, POOLING, NORMALIZE = "Transformer", "Pooling", "Normalize"


@dataclass(frozen=True)
class Pooling:
    modes: tuple[str, ...] = ("mean",)
    normalize: bool = True
    # sentence-transformers can pool without a prompt's tokens; numaserve pools every token.
    include_prompt: bool = True

    @classmethod
    def read(cls, directory: str | Path) -> Pooling:
        """The pooling `directory`'s modules.json declares; the default without one."""
        root = Path(directory)
        path = root / "modules.json"
        if not path.is_file():
            return cls()
        modules = read_json(path)
        kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
        for module, kind in zip(modules, kinds, strict=True):
            if kind not in (TRANSFORMER, POOLING, NORMALIZE):
                raise ModelLoadError(
                    f"{path}: module {module.get('path') or module.get('name')!r} is a "
                    f"{module.get('type')}, which numaserve cannot run (it runs Transformer, "
                    "Pooling and Normalize): its vectors would be wrong without it"
                )
        if POOLING not in kinds:
            raise ModelLoadError(f"{path} has no Pooling module: one vector per text needs one")
        config = root / modules[kinds.index(POOLING)].get("path", "") / "config.json"
        include_prompt = read_json(config).get("include_prompt", True) is not False
        return cls(_modes(config), NORMALIZE in kinds, include_prompt)

    def __call__(self, out: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """One vector per row of `out` (batch, tokens, features), its real tokens given by
        `mask` (numaserve pads on the right)."""
        vectors = [_POOL[mode](out, mask) for mode in self.modes]
        pooled = np.concatenate(vectors, axis=-1) if len(vectors) > 1 else vectors[0]
        if self.normalize:
            pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled.astype(np.float32, copy=False)


def _modes(path: Path) -> tuple[str, ...]:
    config = read_json(path)
    given = config.get("pooling_mode")
    if given is None:
        modes = tuple(mode for key, mode in LEGACY_KEYS.items() if config.get(key))
    else:
        modes = (given,) if isinstance(given, str) else tuple(given)
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ModelLoadError(
            f"{path}: pooling mode {unknown[0]!r} is not one numaserve knows ({', '.join(MODES)})"
        )
    return modes or ("mean",)


def _mean_parts(out, mask):
    weights = mask[..., None].astype(np.float32)
    return (out * weights).sum(1), np.maximum(weights.sum(1), 1e-9)


def _mean(out, mask):
    total, count = _mean_parts(out, mask)
    return total / count


def _mean_sqrt_len(out, mask):
    total, count = _mean_parts(out, mask)
    return total / np.sqrt(count)


def _cls(out, mask):
    return out[np.arange(len(out)), mask.argmax(1)]  # the first real token


def _max(out, mask):
    return np.where(mask[..., None] > 0, out, -np.inf).max(1)


def _weighted_mean(out, mask):
    # Token i (from 1) weighs i: later tokens count more.
    positions = np.arange(1, out.shape[1] + 1, dtype=np.float32)[None, :] - mask.argmax(1)[:, None]
    weights = (mask * positions)[..., None].astype(np.float32)
    return (out * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)


def _last_token(out, mask):
    last = mask.shape[1] - 1 - mask[:, ::-1].argmax(1)
    return out[np.arange(len(out)), last] * mask[np.arange(len(out)), last][:, None]


_POOL = {
    "cls": _cls,
    "max": _max,
    "mean": _mean,
    "mean_sqrt_len_tokens": _mean_sqrt_len,
    "weightedmean": _weighted_mean,
    "lasttoken": _last_token,
}
