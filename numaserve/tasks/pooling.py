"""How an embedding model turns its token vectors into one vector: as its sentence-transformers
modules say (modules.json, NAME/config.json), computed as sentence-transformers computes it:
Pooling, then any Dense projections (EmbeddingGemma's two, LaBSE's one), then Normalize.

They run here, in numpy, after whichever backend computed the token vectors, so every
backend serves them alike. A checkpoint without modules.json (a plain transformers model) gets
the mean of its tokens, made unit length: what numaserve has always served. A module
numaserve cannot run is refused at start, by name: serving the vectors without it would be
wrong with no error at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.files import read_json

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
TRANSFORMER, POOLING, DENSE, NORMALIZE = "Transformer", "Pooling", "Dense", "Normalize"
LATE_INTERACTION = "MultiVectorMask"  # a MultiVectorEncoder's: task multivector's
# A Dense module's activation, by its torch class's name, as numpy computes it.
ACTIVATIONS = {
    "Identity": lambda x: x,
    "Tanh": np.tanh,
    "ReLU": lambda x: np.maximum(x, 0),
    "Sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}


@dataclass(frozen=True, eq=False)
class Dense:
    """sentence-transformers' Dense: activation(x @ weight.T + bias), plus x (or x projected)
    where it adds a residual."""

    weight: np.ndarray  # (out, in), float32
    bias: np.ndarray | None
    activation: str  # a key of ACTIVATIONS
    residual: np.ndarray | None = None  # a projection where in != out; None: x itself
    use_residual: bool = False

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @classmethod
    def read(cls, directory: Path, name: str, reads: str = "sentence_embedding") -> Dense:
        """`reads`: what the module must project (a pooled vector, or token vectors)."""
        config = read_json(directory / "config.json")
        given = str(config.get("activation_function", "torch.nn.modules.activation.Tanh"))
        activation = given.rsplit(".", 1)[-1]
        if activation not in ACTIVATIONS:
            raise ModelLoadError(
                f"{directory}: Dense module {name!r} applies {given}, which numaserve cannot "
                f"compute (it computes {', '.join(ACTIVATIONS)})"
            )
        if config.get("module_input_name", reads) != reads:
            raise ModelLoadError(
                f"{directory}: Dense module {name!r} reads {config['module_input_name']!r}; "
                f"numaserve runs this model's Dense modules on {reads!r}"
            )
        weights = _weights(directory, name)
        use_residual = bool(config.get("use_residual", False))
        return cls(
            weights["linear.weight"],
            weights.get("linear.bias") if config.get("bias", True) else None,
            activation,
            weights.get("residual.weight"),
            use_residual,
        )

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = x @ self.weight.T
        if self.bias is not None:
            out += self.bias
        out = ACTIVATIONS[self.activation](out)
        if self.use_residual:
            out += x if self.residual is None else x @ self.residual.T
        return out


def _weights(directory: Path, name: str) -> dict[str, np.ndarray]:
    """A Dense module's tensors, float32, from its model.safetensors (read without torch:
    the serving image has none)."""
    path = directory / "model.safetensors"
    if not path.is_file():
        raise ModelLoadError(
            f"{directory}: Dense module {name!r} has no model.safetensors (numaserve reads "
            "its weights from safetensors; save the model again with sentence-transformers)"
        )
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(path))
    except Exception as e:  # a truncated or foreign file
        raise ModelLoadError(f"{path}: not readable as safetensors: {e}") from None
    if "linear.weight" not in tensors:
        raise ModelLoadError(f"{path}: no linear.weight, as a Dense module saves it")
    return {key: value.astype(np.float32) for key, value in tensors.items()}


@dataclass(frozen=True)
class Pooling:
    modes: tuple[str, ...] = ("mean",)
    normalize: bool = True
    # sentence-transformers can pool without a prompt's tokens; numaserve pools every token.
    include_prompt: bool = True
    dense: tuple[Dense, ...] = ()  # after pooling, before Normalize, in order

    def dim(self, width: int) -> int:
        """The vector's size, for token vectors `width` wide."""
        return self.dense[-1].out_features if self.dense else width * len(self.modes)

    @classmethod
    def read(cls, directory: str | Path) -> Pooling:
        """The pooling `directory`'s modules.json declares; the default without one."""
        root = Path(directory)
        path = root / "modules.json"
        if not path.is_file():
            return cls()
        modules = read_json(path)
        kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
        if LATE_INTERACTION in kinds:
            raise ModelLoadError(
                f"{path}: a late-interaction (ColBERT) model, one vector per token "
                f"({LATE_INTERACTION}): serve it with task: multivector"
            )
        for module, kind in zip(modules, kinds, strict=True):
            if kind not in (TRANSFORMER, POOLING, DENSE, NORMALIZE):
                raise ModelLoadError(
                    f"{path}: module {_name(module)!r} is a {module.get('type')}, which "
                    "numaserve cannot run (it runs Transformer, Pooling, Dense and Normalize): "
                    "its vectors would be wrong without it"
                )
        if POOLING not in kinds:
            raise ModelLoadError(f"{path} has no Pooling module: one vector per text needs one")
        pooling_at = kinds.index(POOLING)
        order = [k for k in kinds if k != TRANSFORMER]
        if order != [POOLING, *[DENSE] * kinds.count(DENSE), *[NORMALIZE] * (NORMALIZE in kinds)]:
            raise ModelLoadError(
                f"{path}: its modules run {' -> '.join(kinds)}; numaserve runs Transformer, "
                "Pooling, any Dense modules, then Normalize, in that order"
            )
        config = root / modules[pooling_at].get("path", "") / "config.json"
        include_prompt = read_json(config).get("include_prompt", True) is not False
        dense = tuple(
            Dense.read(root / m.get("path", ""), _name(m))
            for m, kind in zip(modules, kinds, strict=True)
            if kind == DENSE
        )
        return cls(_modes(config), NORMALIZE in kinds, include_prompt, dense)

    def __call__(self, out: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """One vector per row of `out` (batch, tokens, features), its real tokens given by
        `mask` (numaserve pads on the right)."""
        vectors = [_POOL[mode](out, mask) for mode in self.modes]
        pooled = np.concatenate(vectors, axis=-1) if len(vectors) > 1 else vectors[0]
        for layer in self.dense:
            pooled = layer(pooled.astype(np.float32, copy=False))
        if self.normalize:
            pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled.astype(np.float32, copy=False)


def _name(module: dict) -> str:
    return str(module.get("path") or module.get("name"))


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
