"""The model of a configuration: built new, or rebuilt from a checkpoint, with the library's
public API only.

>>> from connectors.config import load_config
>>> model_settings(load_config(None, environ={}))["type"]
'IncrementalSVC'
"""

from __future__ import annotations

from typing import Any

import numpy as np

from connectors.checkpoint import CheckpointError, MemberCheck
from connectors.config import Config

__all__ = [
    "build_model", "checkpoint_bounds", "limit_settings", "model_settings", "restore_model",
]

_COMMON = ("C", "kernel", "gamma", "degree", "coef0")
_SLIDING = ("window_size", "step")
#: Bounds on the input that do not change what the model learns from the points it accepts:
#: applied to new and restored models alike, and free to change between restarts.
_LIMITS = ("max_features", "max_new_features")


def model_settings(config: Config) -> dict[str, Any]:
    """The settings that define the model (stored in checkpoints, compared on restore)."""
    model = config.model
    names = _COMMON + (_SLIDING if model.type == "SlidingWindowSVC" else ())
    return {"type": model.type, **{name: getattr(model, name) for name in names}}


def _model_class(name: str) -> type:
    import stream_svm

    try:
        return getattr(stream_svm, name)
    except AttributeError:
        raise ImportError(
            f"this stream_svm has no {name}; model.type must name one of its estimators"
        ) from None


def limit_settings(config: Config) -> dict[str, int | None]:
    """``max_features`` and ``max_new_features`` as the library takes them (0: no cap)."""
    return {name: getattr(config.model, name) or None for name in _LIMITS}


def build_model(config: Config) -> Any:
    """A new, empty model as configured."""
    settings = model_settings(config)
    cls = _model_class(settings.pop("type"))
    return cls(**settings, **limit_settings(config))


def restore_model(config: Config, arrays: dict[str, Any], meta: dict[str, Any]) -> Any:
    """The model of a checkpoint (``to_checkpoint`` output), with the configured class and
    the configured input limits (which may differ from the checkpoint's)."""
    cls = _model_class(config.model.type)
    model = cls.from_checkpoint(arrays, meta)
    for name, value in limit_settings(config).items():
        setattr(model, name, value)
    return model


#: Arrays of the engine-backed models with one row per stored point.
_PER_POINT = ("X", "y", "alpha", "status", "sequence", "margin", "key_kind", "key_int", "key_str")


def checkpoint_bounds(config: Config) -> MemberCheck:
    """The size bounds a checkpoint of the configured model must respect, checked on each
    member's header before it is read: a sliding window holds at most ``window_size`` points,
    and no array of the model holds more than a vector per point (a crafted or foreign file
    claiming more is refused instead of exhausting memory)."""
    rows = config.model.window_size if config.model.type == "SlidingWindowSVC" else None
    columns = config.model.max_features or None

    def check(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        if rows is not None and name in _PER_POINT and shape and shape[0] > rows:
            raise CheckpointError(
                f"member {name!r} holds {shape[0]} points, more than model.window_size={rows}"
            )
        if columns is not None and name == "X" and len(shape) == 2 and shape[1] > columns:
            raise CheckpointError(
                f"member 'X' holds {shape[1]} features, more than model.max_features={columns}"
            )
        if name in ("b", "next_sequence") and shape != ():
            raise CheckpointError(f"member {name!r} must be a scalar, has shape {shape}")

    return check
