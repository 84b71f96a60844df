"""The model of a configuration: built new, or rebuilt from a checkpoint, with the library's
public API only.

>>> from connectors.config import load_config
>>> model_settings(load_config(None, environ={}))["type"]
'IncrementalSVC'
"""

from __future__ import annotations

from typing import Any

from connectors.config import Config

__all__ = ["build_model", "model_settings", "restore_model"]

_COMMON = ("C", "kernel", "gamma", "degree", "coef0")
_SLIDING = ("window_size", "step")


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


def build_model(config: Config) -> Any:
    """A new, empty model as configured."""
    settings = model_settings(config)
    cls = _model_class(settings.pop("type"))
    return cls(**settings)


def restore_model(config: Config, arrays: dict[str, Any], meta: dict[str, Any]) -> Any:
    """The model of a checkpoint (``to_checkpoint`` output), with the configured class."""
    cls = _model_class(config.model.type)
    return cls.from_checkpoint(arrays, meta)
