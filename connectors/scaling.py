"""Feature standardization that keeps exact forgetting meaningful: statistics that never move
once the model has learned anything.

An exact model stores the points it learned as they were transformed when they arrived. A
scaler that keeps updating (River's ``preprocessing.StandardScaler`` in a pipeline) would scale
a later copy of the same message differently, so forgetting it would remove a point the model
never held, and the model's points would mix several scalings: learning a point and then
forgetting it no longer gives the model back. Here the statistics are either given in the
configuration or measured on a warm-up of the first messages, then frozen for the life of the
model (they are checkpointed with it).

>>> scaler = FeatureScaler.fixed({"a": 10.0}, {"a": 2.0})
>>> scaler.transform({"a": 14.0, "b": 3.0})   # a name without statistics passes unchanged
{'a': 2.0, 'b': 3.0}
>>> warming = FeatureScaler.warming_up(messages=2)
>>> warming.observe({"a": 1.0}), warming.observe({"a": 3.0})
(False, True)
>>> warming.transform({"a": 3.0})
{'a': 1.0}

A regressor's targets can be standardized the same way (``scaler.targets``): the model
learns (y - mean) / scale and its predictions are mapped back to y's units.

>>> targets = FeatureScaler.fixed({"a": 0.0}, {"a": 1.0}, target=(200.0, 50.0))
>>> targets.target_to_model(300.0), targets.target_from_model(-1.0)
(2.0, 150.0)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

log = logging.getLogger("stream_svm.scaler")

__all__ = ["FeatureScaler"]

#: Values beyond this size are left out of a warm-up: the sums of squared deviations of
#: values up to it stay finite over 10**7 messages (4e300 each).
MAX_WARMUP_VALUE = 1e150
#: A target this many of the scaler's target scales from its mean is warned of (once): the
#: statistics do not describe the targets. (ChickWeights after a warm-up on its first 100
#: rows, young chicks only: 67; river flows after warm-ups of 500 days or more: at most 43;
#: Gaussian, uniform, exponential targets: under 15.)
FAR_TARGET = 50.0
#: A warm-up whose targets' standard deviation exceeds this many times their robust spread
#: (1.4826 times the median absolute deviation, the standard deviation for Gaussian targets)
#: is warned of: a few targets (sentinels such as -9999, glitches) set the scale, and all the
#: others scale to nearly one value. (Gaussian targets: about 1; exponential: 1.4; the
#: Fisher river's flood-prone flows over 500-1000 days from any day: up to 32; two -9999
#: among 1000 targets of spread 1: 450.)
SPREAD_RATIO = 50.0
#: Likewise against the standard deviation of the targets without the highest and lowest
#: 1 % (one each below 200 targets), which stays whole when more than half the targets are
#: one value (zero-inflated targets, whose median absolute deviation is 0). (Gaussian,
#: exponential targets: 1.1; lognormal of sigma 2: 2.1; the river flows over warm-ups of
#: 100-1000 days from any day: up to 8; two -9999 among 1000 targets: 480, with 600 of them
#: equal: 800. Targets over 98 % one value can exceed it.)
TRIMMED_SPREAD_RATIO = 10.0


class FeatureScaler:
    """x -> (x - mean) / scale per feature name, with frozen statistics.

    Build it with :meth:`fixed` (statistics given) or :meth:`warming_up` (measured on the
    first ``messages`` feature messages with Welford's algorithm, then frozen). A feature
    whose warm-up values are all equal gets scale 1 (it is only centred); a feature never seen
    during the warm-up, or absent from the given statistics, passes unchanged. Missing
    features stay missing (the models read them as 0, the mean, in the scaled space).

    With ``scales_targets`` (a regressor's ``scaler.targets``), the targets get statistics
    too: given (:meth:`fixed`, :meth:`give_targets`), or measured on the targets of the
    warm-up's labelled feature messages (not on late labels, whose arrival beside the
    features' depends on timing: two runs would freeze different statistics).
    """

    def __init__(self, target: int) -> None:
        self.target = target  # feature messages to measure (0: fixed statistics)
        self.seen = 0
        self._count: dict[str, int] = {}
        self._mean: dict[str, float] = {}
        self._m2: dict[str, float] = {}
        self.means: dict[str, float] = {}
        self.scales: dict[str, float] = {}
        self.frozen = False
        self._unscaled: set[str] = set()  # names warned about (see transform)
        self._matched = False  # a message had a feature with statistics (or was warned of)
        # Names of the given statistics that no message has had yet: a feature one typo from
        # one of them is likely its misspelling (see _warn_unscaled).
        self._unused: set[str] = set()
        #: scaler.unknown_features = "dead_letter": a message with a feature the statistics
        #: do not name is refused (:meth:`unknown`), not passed unscaled. A setting, not state.
        self.refuse_unknown = False
        #: scaler.targets: a regressor's targets are standardized too. A setting, not state.
        self.scales_targets = False
        self.target_mean = 0.0
        self.target_scale = 1.0
        #: whether the targets' statistics were given (not measured by the warm-up)
        self._targets_given = False
        # the targets of the warm-up's labelled messages (the messages are held meanwhile,
        # every byte of them: their targets cost little beside)
        self._targets: list[float] = []
        self._far_target_warned = False
        #: what this scaler warned of (its targets' statistics), for a report of its own
        self.warnings: list[str] = []

    @classmethod
    def fixed(cls, means: Mapping[str, float], scales: Mapping[str, float],
              target: tuple[float, float] | None = None) -> FeatureScaler:
        """Given statistics; ValueError unless every scale is finite and > 0, every mean
        finite. ``target``: the targets' ``(mean, scale)``, which standardizes them."""
        for name, value in means.items():
            if not math.isfinite(value):
                raise ValueError(f"the mean of feature {name!r} is not finite: {value!r}")
        for name, value in scales.items():
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"the scale of feature {name!r} must be finite and > 0, "
                                 f"got {value!r}")
        scaler = cls(0)
        if target is not None:
            scaler.give_targets(*(float(value) for value in target))
        scaler.means = {str(k): float(v) for k, v in means.items()}
        scaler.scales = {str(k): float(v) for k, v in scales.items()}
        scaler.frozen = True
        scaler._unused = set(scaler.means) | set(scaler.scales)
        return scaler

    @classmethod
    def warming_up(cls, messages: int) -> FeatureScaler:
        """Statistics measured on the first ``messages`` (>= 1) feature messages."""
        if messages < 1:
            raise ValueError(f"a warm-up needs at least 1 message, got {messages}")
        return cls(messages)

    def give_targets(self, mean: float, scale: float) -> None:
        """Standardize the targets with these statistics (a warm-up then measures the
        features' only). ValueError unless the mean is finite, the scale finite and > 0."""
        if not math.isfinite(mean):
            raise ValueError(f"the targets' mean is not finite: {mean!r}")
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"the targets' scale must be finite and > 0, got {scale!r}")
        self.scales_targets = self._targets_given = True
        self.target_mean, self.target_scale = float(mean), float(scale)

    def observe(self, x: Mapping[str, float], y: float | None = None) -> bool:
        """Add one message's features (and its target ``y``, a regressor's label, when
        targets are scaled) to the warm-up; True once the statistics froze.

        ValueError, and nothing counted, when a value is too large for the statistics (its
        square overflows): one such value made a feature's scale infinite, and every later
        value of it 0."""
        if self.frozen:
            return True
        measure_y = y is not None and self.scales_targets and not self._targets_given
        if measure_y and not (math.isfinite(y) and abs(y) <= MAX_WARMUP_VALUE):
            raise ValueError(f"target {y!r} is too large for the scaler's warm-up statistics "
                             f"(beyond {MAX_WARMUP_VALUE:g} in size)")
        updates = []
        for name, value in x.items():
            if abs(value) > MAX_WARMUP_VALUE:
                # Checked on the value itself: a glitch that came first gave no overflow (its
                # spread was 0), and every ordinary value after it overflowed instead, so
                # that the warm-up never ended and every message was held.
                raise ValueError(f"feature {name!r} = {value!r} is too large for the scaler's "
                                 f"warm-up statistics (beyond {MAX_WARMUP_VALUE:g} in size)")
            count = self._count.get(name, 0) + 1
            mean = self._mean.get(name, 0.0)
            delta = value - mean
            mean += delta / count
            m2 = self._m2.get(name, 0.0) + delta * (value - mean)
            if not (math.isfinite(mean) and math.isfinite(m2)):
                raise ValueError(f"feature {name!r} = {value!r} is too large for the scaler's "
                                 "warm-up statistics (its square overflows)")
            updates.append((name, count, mean, m2))
        for name, count, mean, m2 in updates:
            self._count[name] = count
            self._mean[name] = mean
            self._m2[name] = m2
        if measure_y:
            self._targets.append(float(y))
        self.seen += 1
        if self.seen >= self.target:
            self._freeze()
        return self.frozen

    def target_to_model(self, y: float) -> float:
        """The target the model learns for ``y`` (``y`` itself unless targets are scaled).
        ValueError when it overflows."""
        if not self.scales_targets:
            return y
        if not self.frozen:
            raise RuntimeError("the scaler is still warming up")
        scaled = (y - self.target_mean) / self.target_scale
        if not math.isfinite(scaled):
            raise ValueError(f"target {y!r} is {scaled} once scaled ((y - mean) / scale "
                             "overflows)")
        if abs(scaled) > FAR_TARGET and not self._far_target_warned:
            # Statistics that do not describe the targets (a quiet warm-up: 20.0 throughout,
            # then targets 2.6 apart, 190 of its scales) make a model that cannot fit them.
            self._far_target_warned = True
            self._warn(f"target {y!r} is {abs(scaled):.3g} of the scaler's target scale "
                       f"({self.target_scale:.3g}) from its mean ({self.target_mean:.6g}): "
                       "those statistics do not describe the targets (a warm-up whose targets "
                       "did not span their range?). The model learns the targets as they were "
                       "scaled; give statistics that do (scaler.target_mean and "
                       "scaler.target_scale) with a new checkpoint.dir. Said once")
        return scaled

    def target_from_model(self, value: float) -> float:
        """A prediction of the model in the targets' units."""
        if not self.scales_targets:
            return value
        return self.target_mean + self.target_scale * value

    def _freeze(self) -> None:
        self._warn_of_rare_near_names()
        if self.scales_targets and not self._targets_given:
            self._freeze_targets()
        self.means = dict(self._mean)
        self.scales = {}
        for name, count in self._count.items():
            std = math.sqrt(self._m2[name] / count)
            # A constant feature (or one seen once) is centred only: dividing by a zero or
            # round-off spread would blow later values up.
            self.scales[name] = std if std > 1e-12 * max(1.0, abs(self.means[name])) else 1.0
        self._count, self._mean, self._m2 = {}, {}, {}
        self.frozen = True

    def _freeze_targets(self) -> None:
        targets = np.array(self._targets, dtype=float)
        self._targets = []
        count = len(targets)
        # (Scaled by the largest first: squares of targets up to 1e150 overflow.)
        size = float(np.max(np.abs(targets))) if count else 0.0
        mean = float(np.mean(targets)) if count else 0.0
        std = size * float(np.std(targets / size)) if size > 0 else 0.0
        if not std > 1e-12 * max(1.0, abs(mean)):
            # Without a spread there is nothing to scale by: the targets are only centred,
            # on what little was seen (nothing: not even that).
            self.target_mean, self.target_scale = mean, 1.0
            seen = ("no labelled feature message" if not count else
                    "1 labelled feature message" if count == 1 else
                    f"{count} labelled feature messages, all with one target")
            self._warn(f"the scaler's warm-up saw {seen}: the targets are "
                       f"{'taken as they are' if not count else f'only centred on {mean:g}'}, "
                       "not scaled (give scaler.target_mean and scaler.target_scale, or a "
                       "longer scaler.warmup_messages; late labels do not count)")
            return
        self.target_mean, self.target_scale = mean, std
        log.info("the targets' statistics, from the %d labelled messages of the warm-up: "
                 "mean %r, scale %r (for scaler.target_mean and scaler.target_scale)",
                 count, mean, std)
        deviations = np.abs(targets - mean)
        robust = 1.4826 * float(np.median(np.abs(targets - np.median(targets))))
        farthest = int(np.argmax(deviations))
        share = float(deviations[farthest] ** 2 / (count * std * std))
        cut = max(1, count // 100)
        kept = np.sort(targets)[cut:count - cut] if count >= 10 else targets
        trimmed = float(np.std(kept - mean)) if len(kept) else 0.0
        if robust > 0 and std > SPREAD_RATIO * robust:
            cause = (f"their standard deviation is {std / robust:.3g} times their median "
                     f"absolute deviation's ({robust:.3g}): a few targets far from the others "
                     "(sentinel values such as -9999? glitches?)")
        elif count >= 3 and share > 0.8:
            cause = (f"one of them, {float(targets[farthest])!r}, holds {100 * share:.0f}% "
                     "of their spread (a glitch? targets that hardly moved?)")
        elif count >= 10 and std > TRIMMED_SPREAD_RATIO * trimmed:
            cause = (f"without their highest and lowest {cut} their standard deviation is "
                     f"{trimmed:.3g}: a few targets far from the others (sentinel values such "
                     "as -9999? glitches?)")
        else:
            return
        # Every other target then scales to nearly one value: the model learns next to
        # nothing of them.
        self._warn(f"the targets of the scaler's warm-up set a scale of {std:.3g} (mean "
                   f"{mean:.6g}, {count} targets), but {cause}: the other targets all scale "
                   "to nearly one value. Give the statistics (scaler.target_mean, "
                   "scaler.target_scale) with a new checkpoint.dir")

    def _warn(self, message: str) -> None:
        log.warning("%s", message)
        self.warnings.append(message)

    #: Names compared for typos when the warm-up ends, at most (a pairwise comparison).
    MAX_NAMES_COMPARED = 2000

    def _warn_of_rare_near_names(self) -> None:
        """A name the warm-up saw rarely, one typo from a name it saw often, is most likely a
        misspelling, which gets statistics like any other name and is learned from then on:
        said once, as the statistics are frozen."""
        counts = self._count
        if len(counts) > self.MAX_NAMES_COMPARED:
            return
        rare = max(1, self.seen // 100)
        names = sorted(counts.items())
        for name, count in names:
            if count > rare:
                continue
            common = next((other for other, times in names
                           if times >= 10 * count and _one_typo_apart(name, other)), None)
            if common is not None:
                log.warning("the scaler's warm-up saw feature %r in %d of its %d messages, one "
                            "typo from %r (%d): misspelt? It has statistics now and is learned "
                            "like any other feature; correct its producer", name, count,
                            self.seen, common, counts[common])

    def unknown(self, x: Mapping[str, float]) -> list[str]:
        """The names in ``x`` that the frozen statistics do not name, in ``x``'s order.

        >>> FeatureScaler.fixed({"amount": 50.0}, {"amount": 20.0}).unknown({"amout": 3.0})
        ['amout']
        """
        return [name for name in x if name not in self.scales and name not in self.means]

    def transform(self, x: Mapping[str, float]) -> dict[str, float]:
        """The scaled features (the statistics must be frozen)."""
        if not self.frozen:
            raise RuntimeError("the scaler is still warming up")
        means, scales = self.means, self.scales
        if self._unused:
            self._unused.difference_update(x)
        unscaled = [name for name in x if name not in scales and name not in means]
        no_match = (bool(unscaled) and len(unscaled) == len(x) and self.target == 0
                    and not self._matched)
        if no_match:
            self._warn_no_match(unscaled)
        elif len(unscaled) < len(x):
            self._matched = True
        for name in unscaled:
            if name not in self._unscaled:
                self._warn_unscaled(name, typos=not no_match)
        return {name: (value - means.get(name, 0.0)) / scales.get(name, 1.0)
                for name, value in x.items()}

    def _warn_no_match(self, names: list[str]) -> None:
        # Given statistics under other names (a typo, "x1" for "1") scale nothing, which the
        # INFO lines of single names would leave unnoticed: said once, as a warning.
        self._matched = True
        given = sorted(set(self.means) | set(self.scales))
        log.warning("no feature of a message has statistics in the scaler: its settings name "
                    "%s, the message has %s (misspelt names?); such features pass unscaled",
                    ", ".join(map(repr, given[:10])) + (" ..." if len(given) > 10 else ""),
                    ", ".join(map(repr, names[:10])) + (" ..." if len(names) > 10 else ""))

    #: Feature names warned about as unscaled (beyond them: one last warning, then silence).
    MAX_UNSCALED_WARNINGS = 100

    def _warn_unscaled(self, name: str, typos: bool = True) -> None:
        # Beside standardized features, a raw one (an amount in the thousands) dominates an
        # RBF kernel's distances: worth a line, once per name.
        if len(self._unscaled) >= self.MAX_UNSCALED_WARNINGS:
            return
        self._unscaled.add(name)
        close = next((other for other in sorted(self._unused) if _one_typo_apart(name, other)),
                     None) if typos else None
        if close is not None:
            # A setting's typo ("bb" for "b") scaled nothing of the feature, and said so only
            # at INFO, as a feature left out on purpose.
            log.warning("feature %r has no statistics in the scaler, whose settings name %r "
                        "(misspelt?): the model takes it unscaled", name, close)
        else:
            # Given statistics may leave a feature out on purpose: said, not warned about.
            log.log(logging.INFO if self.target == 0 else logging.WARNING,
                    "feature %r has no statistics in the scaler (not in its settings, or not "
                    "seen during its warm-up): the model takes it unscaled", name)
        if len(self._unscaled) == self.MAX_UNSCALED_WARNINGS:
            log.warning("%d features without statistics: further ones are not named",
                        self.MAX_UNSCALED_WARNINGS)

    # -- checkpoint ------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """JSON-ready state: the frozen statistics, or the warm-up's running sums."""
        # (The targets' statistics only when they are scaled: a state without them reads in
        # versions before them.)
        targets: dict[str, Any] = {}
        if self.frozen or self._targets_given:
            targets = {"target": [self.target_mean, self.target_scale]}
        elif self.scales_targets:
            targets = {"targets": list(self._targets)}
        if self.frozen:
            return {"frozen": True, "means": self.means, "scales": self.scales,
                    **(targets if self.scales_targets else {})}
        return {"frozen": False, "seen": self.seen, "count": self._count, "mean": self._mean,
                "m2": self._m2, **(targets if self.scales_targets else {})}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state` output (ValueError when malformed)."""
        if ("target" in state or "targets" in state) != self.scales_targets:
            raise ValueError("the scaler's state was made with its targets "
                             f"{'scaled' if not self.scales_targets else 'unscaled'}, this "
                             f"scaler {'scales' if self.scales_targets else 'does not scale'}"
                             " them (scaler.targets)")
        if not state.get("frozen", True) and self._targets_given != ("target" in state):
            raise ValueError("the scaler's state was made with its targets' statistics "
                             f"{'measured' if self._targets_given else 'given'}, this scaler "
                             f"{'is given them' if self._targets_given else 'measures them'} "
                             "(scaler.target_mean, scaler.target_scale)")
        try:
            target = state.get("target")
            if self._targets_given and target is not None and [
                    self.target_mean, self.target_scale] != [float(v) for v in target]:
                raise ValueError(
                    f"the scaler's state has the targets' mean and scale {target}, this "
                    f"scaler is given {self.target_mean!r} and {self.target_scale!r} "
                    "(scaler.target_mean, scaler.target_scale)")
            if state["frozen"]:
                restored = FeatureScaler.fixed(
                    {str(k): float(v) for k, v in state["means"].items()},
                    {str(k): float(v) for k, v in state["scales"].items()},
                    None if target is None else (float(target[0]), float(target[1])))
                self.means, self.scales, self.frozen = restored.means, restored.scales, True
                self.target_mean = restored.target_mean
                self.target_scale = restored.target_scale
                self._unused = restored._unused if self.target == 0 else set()
                return
            if "target" in state:
                self.give_targets(float(state["target"][0]), float(state["target"][1]))
            elif self.scales_targets:
                targets = state["targets"]
                if not (isinstance(targets, list) and len(targets) <= int(state["seen"])
                        and all(type(v) in (int, float) and math.isfinite(v)
                                and abs(v) <= MAX_WARMUP_VALUE for v in targets)):
                    raise ValueError("malformed scaler state: its targets are not a list of "
                                     "finite numbers, one at most per message seen")
                self._targets = [float(v) for v in targets]
            self.seen = int(state["seen"])
            self._count = {str(k): int(v) for k, v in state["count"].items()}
            self._mean = {str(k): float(v) for k, v in state["mean"].items()}
            self._m2 = {str(k): float(v) for k, v in state["m2"].items()}
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            raise ValueError(f"malformed scaler state: {exc!r}") from None
        if set(self._count) != set(self._mean) or set(self._mean) != set(self._m2):
            raise ValueError("malformed scaler state: its sums name different features")


def _one_typo_apart(first: str, second: str) -> bool:
    """Whether two names differ by one typo: case alone, or one character added, dropped,
    replaced, or two neighbours swapped. Not names of a numbered family (x2 and x3, f10 and
    f1), nor names of one character and another (a and c): other features, most likely.

    >>> _one_typo_apart("amout", "amount"), _one_typo_apart("country", "amount")
    (True, False)
    >>> _one_typo_apart("x3", "x2"), _one_typo_apart("c", "b"), _one_typo_apart("b", "bb")
    (False, False, True)
    """
    if first.lower() == second.lower():
        return True
    if first.rstrip("0123456789") == second.rstrip("0123456789"):
        return False  # (one family, other numbers)
    if len(first) == len(second) and len(first) < 3:
        return False  # (a replaced character leaves too little of a short name)
    if abs(len(first) - len(second)) > 1:
        return False
    if len(first) > len(second):
        first, second = second, first
    start = 0
    while start < len(first) and first[start] == second[start]:
        start += 1
    if len(first) < len(second):  # one added
        return first[start:] == second[start + 1:]
    return (first[start + 1:] == second[start + 1:]  # one replaced
            or (first[start + 2:] == second[start + 2:]  # two neighbours swapped
                and first[start:start + 2] == second[start:start + 2][::-1]))


def unknown_features_error(names: list[str]) -> str:
    """Why a message with features the scaler has no statistics for is refused."""
    shown = ", ".join(map(repr, names[:10])) + (f" and {len(names) - 10} more"
                                                if len(names) > 10 else "")
    return (f"feature{'s' if len(names) > 1 else ''} {shown} "
            f"{'have' if len(names) > 1 else 'has'} no statistics in the scaler (not in "
            "scaler.scales or scaler.means, or not seen during its warm-up; misspelt?), and "
            "scaler.unknown_features = \"dead_letter\": the message is neither answered nor "
            "learned")
