"""The model of a configuration: built new, or rebuilt from a checkpoint, with the library's
public API only.

>>> from connectors.config import load_config
>>> model_settings(load_config(None, environ={}))["type"]
'IncrementalSVC'
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from connectors.checkpoint import (
    CheckpointError,
    CheckpointMismatch,
    CheckpointStore,
    MemberCheck,
)
from connectors.config import DAEMON_MODEL_SETTINGS, MODEL_TYPES, SCHEMA, Config, ConfigError
from connectors.messages import MAX_ID_LENGTH, Malformed, features_of
from connectors.scaling import FeatureScaler

__all__ = [
    "applicable_settings", "build_model", "build_scaler", "check_model_config",
    "checkpoint_bounds", "checkpointed_settings",
    "default_model_settings", "limit_settings", "model_settings", "restore_model",
    "settings_mismatch",
]

#: Bounds on the input that do not change what the model learns from the points it accepts:
#: applied to new and restored models alike, and free to change between restarts.
_LIMITS = ("max_features", "max_new_features", "far_points")


def _model_class(name: str) -> type:
    import stream_svm

    try:
        return getattr(stream_svm, name)
    except AttributeError:
        raise ImportError(
            f"this stream_svm has no {name}; model.type must name one of its estimators"
        ) from None


def _parameters(model_type: str) -> dict[str, inspect.Parameter]:
    parameters = inspect.signature(_model_class(model_type).__init__).parameters
    return {name: p for name, p in parameters.items() if name != "self"}


def applicable_settings(model_type: str) -> list[str]:
    """The ``model.*`` settings that apply to a model type: those naming a parameter of its
    constructor.

    >>> applicable_settings("IncrementalLSSVR")
    ['gamma', 'rho', 'features', 'n_components', 'fit_intercept', 'seed', 'max_features', \
'max_new_features']
    """
    parameters = _parameters(model_type)
    return [name for name in SCHEMA["model"] if name in parameters]


def model_settings(config: Config) -> dict[str, Any]:
    """The settings that define the model (stored in checkpoints, compared on restore)."""
    model = config.model
    names = [n for n in applicable_settings(model.type) if n not in _LIMITS]
    return {"type": model.type, **{name: getattr(model, name) for name in names}}


def default_model_settings(model_type: str) -> dict[str, Any]:
    """:func:`model_settings` of a configuration that sets nothing but ``model.type``: what a
    checkpoint written before a setting existed was made with."""
    names = [n for n in applicable_settings(model_type) if n not in _LIMITS]
    return {"type": model_type, **{name: SCHEMA["model"][name].default for name in names}}


def limit_settings(config: Config) -> dict[str, Any]:
    """``max_features`` and ``max_new_features`` as the library takes them (0 is no cap, None;
    an unset ``max_features`` the model type's own default), and ``far_points`` where the
    type takes it."""
    parameters = _parameters(config.model.type)
    limits: dict[str, Any] = {}
    for name in _LIMITS:
        if name not in parameters:
            continue  # (far_points: the LS-SVMs hold no points, nor a kernel's scale)
        value = getattr(config.model, name)
        if name == "far_points":
            limits[name] = value
        else:
            limits[name] = parameters[name].default if value is None else value or None
    return limits


def checkpointed_settings(config: Config) -> dict[str, Any]:
    """What a checkpoint must have been made with to be restored: the model's settings and,
    when features are scaled, the scaler's (a model learned on other scalings is another
    model)."""
    settings = model_settings(config)
    scaler = config.scaler
    if scaler.mode != "none":
        settings["scaler"] = {"mode": scaler.mode}
        if scaler.mode == "warmup":
            settings["scaler"]["warmup_messages"] = scaler.warmup_messages
        else:
            settings["scaler"].update(means=scaler.means or {}, scales=scaler.scales or {})
        if scaler.targets:  # (only then: settings recorded before it had it false)
            settings["scaler"]["targets"] = True
            if scaler.target_scale is not None:
                settings["scaler"].update(target_mean=scaler.target_mean,
                                          target_scale=scaler.target_scale)
    return settings


def settings_mismatch(saved: Any, settings: dict[str, Any]) -> str | None:
    """None when a checkpoint or published state made with ``saved`` settings (its
    ``model_settings``) can serve a configuration whose :func:`checkpointed_settings` are
    ``settings``; else the differences, as ``C 1.0 -> 2.0, ...``. A setting added after the
    state was written had its default then.

    >>> settings_mismatch({"type": "IncrementalSVC", "C": 2.0},
    ...                   {**default_model_settings("IncrementalSVC"), "C": 1.0})
    'C 2.0 -> 1.0'
    """
    if isinstance(saved, dict) and isinstance(saved.get("type"), str):
        try:
            saved = {**default_model_settings(saved["type"]), **saved}
        except ImportError:
            pass  # an unknown type: reported as a difference below
    if saved == settings:
        return None
    if not isinstance(saved, dict):
        return f"{saved!r} -> {settings!r}"
    # A parameter the model's kernel (or feature map) does not use changes nothing: one given
    # with a linear kernel, before such settings were refused, must not keep its model from
    # being restored once the setting is taken out.
    unused = _unused_by(saved) if all(
        saved.get(chooser) == settings.get(chooser) for chooser in _KERNEL_SETTINGS) else set()
    def shown(values: dict, name: str) -> str:
        # (A setting the other model type does not have: "step None -> 1" read as a step.)
        return repr(values[name]) if name in values else "(none)"

    def differences(saved: dict, settings: dict, prefix: str = "") -> list[str]:
        changed = []
        for name in sorted(set(settings) | set(saved)):
            if saved.get(name) == settings.get(name) or (not prefix and name in unused):
                continue
            if isinstance(saved.get(name), dict) and isinstance(settings.get(name), dict):
                # (A table, the scaler's: the values that changed, not the whole table twice.)
                changed += differences(saved[name], settings[name], f"{prefix}{name}.")
            else:
                changed.append(f"{prefix}{name} {shown(saved, name)} -> {shown(settings, name)}")
        return changed

    return ", ".join(differences(saved, settings)) or None


def build_scaler(config: Config) -> FeatureScaler | None:
    """The configured scaler (None: features go to the model as they are)."""
    scaler = config.scaler
    if scaler.mode == "warmup":
        built = FeatureScaler.warming_up(scaler.warmup_messages)
        if scaler.targets and scaler.target_scale is not None:
            built.give_targets(scaler.target_mean, scaler.target_scale)
        else:
            built.scales_targets = scaler.targets
    elif scaler.mode == "fixed":
        built = FeatureScaler.fixed(
            scaler.means or {}, scaler.scales or {},
            (scaler.target_mean, scaler.target_scale) if scaler.targets else None)
    else:
        return None
    built.refuse_unknown = scaler.unknown_features == "dead_letter"
    return built


def build_model(config: Config) -> Any:
    """A new, empty model as configured."""
    settings = model_settings(config)
    cls = _model_class(settings.pop("type"))
    return cls(**settings, **limit_settings(config))


#: The model settings each kernel (``model.kernel``) and each feature map of the LS-SVMs
#: (``model.features``) uses: the others are parameters of the other kernels.
_KERNEL_SETTINGS = {
    "kernel": {"linear": (), "rbf": ("gamma",), "poly": ("gamma", "degree", "coef0")},
    "features": {"linear": (), "rff": ("gamma", "n_components", "seed")},
}


def _unused_by(settings: Mapping[str, Any]) -> set[str]:
    """The settings that the kernel and feature map chosen in ``settings`` do not use."""
    return {name for chooser, uses in _KERNEL_SETTINGS.items()
            if settings.get(chooser) in uses
            for names in uses.values() for name in names
            if name not in uses[settings[chooser]]}


def _unused_by_kernel(config: Config, name: str) -> str | None:
    """``"model.kernel linear"`` (say) when setting ``name`` is a parameter of other kernels or
    feature maps than the one configured, else None."""
    applicable = applicable_settings(config.model.type)
    for chooser, uses in _KERNEL_SETTINGS.items():
        if chooser not in applicable:
            continue
        chosen = getattr(config.model, chooser)
        if any(name in names for names in uses.values()) and name not in uses[chosen]:
            return f"model.{chooser} {chosen}"
    return None


def check_model_config(config: Config) -> None:
    """ConfigError for a ``model.*`` setting given for a type it does not apply to, or for
    settings the model's constructor refuses (e.g. weight_threshold >= weight_increment)."""
    model_type = config.model.type
    applicable = set(applicable_settings(model_type))
    type_given = config.sources.get("model.type", "default") != "default"
    for name in SCHEMA["model"]:
        if name in DAEMON_MODEL_SETTINGS:
            continue  # the daemon's, not the model's
        source = config.sources.get(f"model.{name}", "default")
        if not type_given and name not in applicable and source != "default":
            # (window_size = 1000 without a type served an IncrementalSVC that grew with
            # the stream: 1000 is the default window, and a default value was let pass)
            owners = [t for t in MODEL_TYPES if name in applicable_settings(t)]
            raise ConfigError(
                f"setting model.{name} (from {source}) does not apply to model.type "
                f"{model_type}, the default, since model.type is not set: {name} is a setting "
                f"of {', '.join(owners)}")
        unused = _unused_by_kernel(config, name)
        if unused is not None and source != "default" and (
                getattr(config.model, name) != SCHEMA["model"][name].default):
            raise ConfigError(f"setting model.{name} (from {source}) does not apply to {unused}")
        # A value equal to the default changes nothing (a configuration written out whole,
        # e.g. from Config.as_dict, lists every setting).
        if (name != "type" and name not in applicable and source != "default"
                and getattr(config.model, name) != SCHEMA["model"][name].default):
            raise ConfigError(
                f"setting model.{name} (from {source}) does not apply to model.type "
                f"{model_type}; its settings are: {', '.join(sorted(applicable))}"
            )
    try:
        build_model(config)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"model settings refused by {model_type}: {exc}") from None
    except MemoryError:
        raise ConfigError(f"model settings refused by {model_type}: its empty model does not "
                          "fit in memory (model.n_components or model.max_features)") from None


def check_restored_settings(model: Any, settings: Mapping[str, Any]) -> None:
    """ValueError when a model restored from a checkpoint was not made with ``settings`` (its
    :func:`model_settings`). The daemon compares the settings a checkpoint says it was made
    with to the configuration before restoring it, but the model is built from the parameters
    its own metadata holds: where the two disagree (a damaged or edited checkpoint), the
    model would serve with parameters nobody configured (it had kept 110 of 250 points, with
    a reserve_epsilon set nowhere)."""
    params = model._get_params()
    unused = _unused_by(settings)  # (a linear kernel's gamma changes nothing of the model)
    for name, value in settings.items():
        if name == "type" or name not in params or name in unused:
            continue
        if _as_json(params[name]) != _as_json(value):
            raise ValueError(
                f"the checkpoint's model has {name}={params[name]!r}, but the settings it was "
                f"saved with say {value!r}: a damaged or edited checkpoint")


def _as_json(value: Any) -> Any:
    """A setting as JSON gives it back (tuples as lists, numpy scalars as Python's)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_as_json(item) for item in value]
    return value


def restore_model(config: Config, arrays: dict[str, Any], meta: dict[str, Any]) -> Any:
    """The model of a checkpoint (``to_checkpoint`` output), with the configured class and
    the configured input limits (which may differ from the checkpoint's); ValueError when the
    model is not the configured one (see :func:`check_restored_settings`)."""
    cls = _model_class(config.model.type)
    model = cls.from_checkpoint(arrays, meta)
    check_restored_settings(model, model_settings(config))
    for name, value in limit_settings(config).items():
        setattr(model, name, value)
    return model


#: Arrays of the engine-backed models with one row per stored point.
_PER_POINT = ("X", "y", "alpha", "status", "sequence", "margin", "key_kind", "key_int", "key_str",
              "key_str_ends", "linear", "gap", "target", "h", "h_abs", "h_drift", "store",
              "factor", "g", "checked_terms")


def _too_many_features(features: int, member: str, limit: int) -> CheckpointMismatch:
    """A checkpoint's model made while model.max_features was higher. The member's shape
    agrees with the manifest and the bytes stored, so this is no damage: set aside as such,
    the checkpoint before it was restored and the messages since learned again, or refused."""
    return CheckpointMismatch(
        f"the checkpoint's model holds {features} features (member {member!r}), more than "
        f"model.max_features={limit} allows. Nothing was changed. Set model.max_features to "
        f"{features} at least: it may change between restarts, but not below what the model "
        "holds.")


def checkpoint_bounds(config: Config) -> MemberCheck:
    """The size bounds a checkpoint of the configured model must respect, checked on each
    member's header before it is read: a sliding window holds at most ``window_size`` points,
    no array of the model holds more than a vector per point over ``max_features`` features,
    and an LS-SVM's matrices are at most that wide (a crafted or foreign file claiming more is
    refused instead of exhausting memory)."""
    model = config.model
    rows = model.window_size if model.type in ("SlidingWindowSVC", "SlidingWindowSVR") else None
    columns = limit_settings(config)["max_features"]
    width = None
    if model.type in ("IncrementalLSSVC", "IncrementalLSSVR"):
        inputs = model.n_components if model.features == "rff" else columns
        width = None if inputs is None else inputs + 1

    def check(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        if rows is not None and name in _PER_POINT and shape and shape[0] > rows:
            raise CheckpointError(
                f"member {name!r} holds {shape[0]} points, more than model.window_size={rows}"
            )
        if (rows is not None and name == "key_str_utf8" and shape
                and shape[0] > rows * 4 * MAX_ID_LENGTH):
            raise CheckpointError(
                f"member {name!r} holds {shape[0]} bytes of keys, more than "
                f"model.window_size={rows} ids of {MAX_ID_LENGTH} characters take")
        if columns is not None and name in ("X", "aisvc_rows", "omega") and len(shape) == 2:
            features = shape[0] if name == "omega" else shape[1]
            if features > columns:
                raise _too_many_features(features, name, columns)
        if width is not None and name in _LSSVM_STATE and any(n > width for n in shape):
            if model.features != "rff":  # (its width is max_features + 1: see just above)
                raise _too_many_features(max(shape) - 1, name, columns)
            raise CheckpointError(
                f"member {name!r} has shape {shape}, wider than the model's {width} columns"
            )
        if name in ("b", "next_sequence", "shift", "diag_scale") and shape != ():
            raise CheckpointError(f"member {name!r} must be a scalar, has shape {shape}")

    return check


#: An LS-SVM's state: square matrices and vectors over its columns (bias + features).
_LSSVM_STATE = ("gram_hi", "gram_lo", "rhs_hi", "rhs_lo", "solution")


@dataclass
class ServedModel:
    """The model of a daemon's checkpoint with its feature scaler: predictions offline, in a
    notebook or a batch job, as the daemon makes them (see :func:`load_served_model`)."""

    model: Any
    scaler: FeatureScaler | None
    path: Path

    def features(self, x: Mapping[str, float]) -> dict[str, float]:
        """x as the model sees it: checked and scaled as the daemon checks and scales a
        message's ``x`` (:class:`connectors.messages.Malformed`, a ValueError, for what the
        daemon dead-letters: a value that is no finite number, a bool, None; numpy's numbers
        count as the numbers they hold).

        >>> ServedModel(None, None, Path(".")).features({"a": float("nan")})
        Traceback (most recent call last):
        ...
        connectors.messages.Malformed: feature 'a' must be a finite number, got NaN
        """
        if not isinstance(x, Mapping):
            raise Malformed(f"x must be a mapping of feature: number, got {type(x).__name__}")
        for name in x:
            if not isinstance(name, str):  # (a message's names are JSON's: text)
                raise Malformed(f"feature name {name!r} is not a str, as the daemon's are")
        checked = features_of({"x": {name: value.item() if isinstance(value, np.generic)
                                     else value for name, value in x.items()}})
        return checked if self.scaler is None else self.scaler.transform(checked)

    def predict_one(self, x: Mapping[str, float]) -> Any:
        prediction = self.model.predict_one(self.features(x))
        if self.scaler is not None and self.scaler.scales_targets:
            return self.scaler.target_from_model(prediction)  # (in the targets' units)
        return prediction

    def predict_proba_one(self, x: Mapping[str, float]) -> dict[Any, float]:
        if not hasattr(self.model, "predict_proba_one"):
            raise TypeError(f"{type(self.model).__name__} is a regressor: it has no class "
                            "probabilities (predict_one gives its prediction)")
        return self.model.predict_proba_one(self.features(x))


def load_served_model(checkpoint_dir: str | os.PathLike[str]) -> ServedModel:
    """The model of the newest readable checkpoint a daemon wrote in ``checkpoint_dir``, with
    its scaler. The directory is only read (a running daemon's directory is fine); a newer
    checkpoint that does not read back is skipped. Raises :class:`CheckpointError` when there
    is none.

    >>> served = load_served_model("checkpoints/bananas")  # doctest: +SKIP
    >>> served.predict_one({"x1": 0.4, "x2": -1.2})  # doctest: +SKIP
    True
    """
    directory = Path(checkpoint_dir)
    if not directory.is_dir():
        raise CheckpointError(f"{directory} is not a directory")
    store = CheckpointStore(directory)
    problems = []
    for _, path in store.paths():
        try:
            checkpoint = store.read(path)
            model_type = checkpoint.state["model_settings"]["type"]
            model = _model_class(str(model_type)).from_checkpoint(checkpoint.arrays,
                                                                  checkpoint.model_meta)
            check_restored_settings(model, {**default_model_settings(str(model_type)),
                                            **checkpoint.state["model_settings"]})
            scaled = checkpoint.state["processor"].get("scaler")
        except (CheckpointError, KeyError, TypeError, ValueError) as exc:
            problems.append(f"{path.name}: {exc}")
            continue
        scaler = None
        if scaled is not None:
            scaler = FeatureScaler(0)
            scaler.scales_targets = isinstance(scaled, dict) and (
                "target" in scaled or "targets" in scaled)
            scaler.load_state(scaled)
            if not scaler.frozen:
                raise CheckpointError(
                    f"{path}: the daemon's scaler was still measuring its warm-up messages "
                    f"({scaler.seen} of them): the model has learned nothing yet")
        return ServedModel(model, scaler, path)
    raise CheckpointError(f"no readable checkpoint in {directory}"
                          + (f" ({'; '.join(problems)})" if problems else "")
                          + ("; with model.scope partition or key the models are on the state "
                             "topic, and this directory only holds evicted copies"
                             if (directory / "models").is_dir() and not problems else ""))
