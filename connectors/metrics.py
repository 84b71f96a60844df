"""Prometheus metrics of the daemon, on their own registry, served at ``/metrics``.

>>> metrics = Metrics()
>>> metrics.messages.labels(outcome="learned").inc(3)
>>> b"stream_svm_messages_total{outcome=\\"learned\\"} 3.0" in metrics.render()
True
"""

from __future__ import annotations

import logging
import time
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

__all__ = ["OUTCOMES", "PUBLISH_OUTCOMES", "RESTORE_OUTCOMES", "Metrics"]

log = logging.getLogger(__name__)

#: What became of a message (label values of ``stream_svm_messages_total``).
OUTCOMES = (
    "learned", "predicted", "labelled", "forgotten", "relabeled", "dead_lettered", "skipped",
)

#: Label values of ``stream_svm_state_publish_total`` and ``stream_svm_state_restores_total``.
PUBLISH_OUTCOMES = ("published", "failed", "stale")
RESTORE_OUTCOMES = ("newer", "unchanged", "none", "refused", "failed")

_SECONDS_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
)
_BREAKPOINT_BUCKETS = (0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987)


class Metrics:
    """All metrics of one daemon. ``serve(host, port)`` starts the HTTP endpoint."""

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 per_model: bool = False) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        #: With one model per partition or key (model.scope), the gauges that describe one
        #: model carry a ``model`` label: see :meth:`for_model`.
        self.per_model = per_model
        labels = ["model"] if per_model else []
        self._model_labels = labels
        self.breakpoints = Counter(
            "stream_svm_breakpoints", "Breakpoints of the path-following updates", registry=r
        )
        self.update_retries = Counter(
            "stream_svm_update_retries",
            "Model updates that round-off derailed, by how they were completed: point by point "
            "(one_at_a_time) or by learning their points afresh (afresh); a growing count "
            "tells that the kernel matrix is near singular",
            ["how"],
            registry=r,
        )
        self.far_points = Counter(
            "stream_svm_far_points",
            "Points to learn (refused ones too) whose K(x, x) was more than 1e8 times the "
            "largest of the points stored then (linear and polynomial kernels: a unit slip, an "
            "unscaled feature); while one is stored, updates may be refused: send a forget for "
            "it",
            registry=r,
        )
        self.update_breakpoints = Histogram(
            "stream_svm_update_breakpoints",
            "Breakpoints per model update",
            buckets=_BREAKPOINT_BUCKETS,
            registry=r,
        )
        self.update_seconds = Histogram(
            "stream_svm_update_seconds",
            "Wall time of one model update (learn, forget, relabel or window slide)",
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.predict_seconds = Histogram(
            "stream_svm_predict_seconds",
            "Wall time of one vectorized prediction of a batch",
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.batch_seconds = Histogram(
            "stream_svm_batch_seconds",
            "Wall time of processing one polled batch (parse, predict, learn, produce)",
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "stream_svm_batch_messages",
            "Messages per polled batch",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000),
            registry=r,
        )
        self.messages = Counter(
            "stream_svm_messages", "Messages by outcome", ["outcome"], registry=r
        )
        # Children by label value: labels() validates its arguments on every call (3 us for
        # the two counters a learned message bumps, in a loop of 50 us per message).
        self._outcomes = {outcome: self.messages.labels(outcome=outcome) for outcome in OUTCOMES}
        self.dead_letters = Counter(
            "stream_svm_dead_letters",
            "Dead-lettered messages by kind of problem",
            ["reason"],
            registry=r,
        )
        self.margin = Gauge("stream_svm_margin_vectors", "Points in the margin set", labels,
                            registry=r)
        self.error = Gauge("stream_svm_error_vectors", "Points in the error set", labels,
                           registry=r)
        self.reserve = Gauge("stream_svm_reserve_vectors", "Points in the reserve set", labels,
                             registry=r)
        self.stored = Gauge(
            "stream_svm_stored_points",
            "Points the model holds (learned and not forgotten, discarded or slid out)",
            labels,
            registry=r,
        )
        self.feature_names = Gauge(
            "stream_svm_feature_names",
            "Feature names the model holds (points are stored over all of them: an update and "
            "a prediction cost about points x names)",
            labels,
            registry=r,
        )
        self._window: Gauge | None = None
        self._errors: tuple[Gauge, Gauge] | None = None
        self._accuracy: Gauge | None = None
        self.cached = Gauge(
            "stream_svm_cached_unlabelled",
            "Unlabelled feature vectors waiting for a label",
            labels,
            registry=r,
        )
        self.cached_bytes = Gauge(
            "stream_svm_cached_unlabelled_bytes",
            "Estimated memory of the unlabelled feature vectors waiting for a label",
            labels,
            registry=r,
        )
        self.held = Gauge(
            "stream_svm_held_messages",
            "Messages held until the scaler's warm-up is complete (then processed in order)",
            labels,
            registry=r,
        )
        self.cache_evictions = Counter(
            "stream_svm_cache_evictions",
            "Unlabelled points dropped from the cache before their label came, by the bound "
            "that dropped them (entries, bytes, age)",
            ["reason"],
            registry=r,
        )
        self.scored = Counter(
            "stream_svm_progressive_predictions",
            "Predictions scored against their label",
            ["correct"],
            registry=r,
        )
        self._scored = {value: self.scored.labels(correct=value)
                        for value in ("true", "false", "na")}
        self.lag = Gauge(
            "stream_svm_consumer_lag",
            "Messages behind the high watermark",
            ["topic", "partition"],
            registry=r,
        )
        self.stalled = Gauge(
            "stream_svm_stalled_partitions",
            "Partitions with messages to read whose position has not moved for a minute",
            registry=r,
        )
        self.labels_waiting = Gauge(
            "stream_svm_label_partitions_waiting",
            "Partitions of the label topic paused because their next label is newer than "
            "what was read of the input topic, which has messages left to read",
            registry=r,
        )
        self.checkpoints = Counter(
            "stream_svm_checkpoints", "Checkpoints written", registry=r
        )
        self.checkpoint_failures = Counter(
            "stream_svm_checkpoint_failures", "Checkpoints that could not be written", registry=r
        )
        self.checkpoint_seconds = Histogram(
            "stream_svm_checkpoint_seconds",
            "Wall time of writing one checkpoint",
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self._last_checkpoint = time.monotonic()
        self.since_checkpoint = Gauge(
            "stream_svm_seconds_since_checkpoint",
            "Seconds since the last checkpoint was written (or since start)",
            registry=r,
        )
        self.since_checkpoint.set_function(lambda: time.monotonic() - self._last_checkpoint)
        # What a restart would have to read again: 0 on an idle stream whose every message is
        # in a checkpoint (seconds_since_checkpoint keeps growing there: nothing to write).
        self._unsaved_since: float | None = None
        self.unsaved_seconds = Gauge(
            "stream_svm_seconds_unsaved",
            "Seconds since the oldest processed message that no checkpoint holds yet was "
            "processed (0: every processed message is in a checkpoint)",
            registry=r,
        )
        self.unsaved_seconds.set_function(
            lambda: 0.0 if self._unsaved_since is None else time.monotonic() - self._unsaved_since)
        self.latency = Histogram(
            "stream_svm_message_latency_seconds",
            "From the input message's timestamp to its output being flushed",
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.broker_errors = Counter(
            "stream_svm_broker_errors",
            "Failed attempts to reach the broker and connections to it that were lost",
            registry=r,
        )
        self.connected = Gauge(
            "stream_svm_connected",
            "1 while the daemon's consumer holds a connection to the broker, else 0",
            registry=r,
        )
        self.partition_resets = Counter(
            "stream_svm_partition_resets",
            "Partitions that no longer hold the offsets the daemon resumes from (the topic was "
            "recreated, or the broker lost or truncated its data)",
            ["topic", "partition", "cause"],
            registry=r,
        )
        self.partitions_added = Counter(
            "stream_svm_partitions_added",
            "Partitions an input topic gained while the daemon ran (added, or the topic was "
            "recreated with more), which it then reads too",
            ["topic"],
            registry=r,
        )
        self.batch_failures = Counter(
            "stream_svm_batch_failures",
            "Polled batches whose processing failed as a whole (the daemon then stops without "
            "checkpointing or committing them)",
            registry=r,
        )
        self._replica: tuple[Gauge, Counter, Histogram, Counter] | None = None
        self._scale_out: tuple[Gauge, Counter, Counter, Counter, Counter] | None = None
        self._server: Any = None

    def processed_unsaved(self) -> None:
        """Messages were processed that the next checkpoint is to hold."""
        if self._unsaved_since is None:
            self._unsaved_since = time.monotonic()

    def checkpointed(self, seconds: float) -> None:
        self._last_checkpoint = time.monotonic()
        self._unsaved_since = None
        self.checkpoints.inc()
        self.checkpoint_seconds.observe(seconds)

    def render(self) -> bytes:
        """The exposition text, as ``/metrics`` serves it."""
        return generate_latest(self.registry)

    @property
    def window(self) -> Gauge:
        """``stream_svm_window_points``, registered on first use: only a sliding-window model
        has a window."""
        if self._window is None:
            self._window = Gauge(
                "stream_svm_window_points",
                "Points in the sliding window's current solution (arrivals waiting for the "
                "next slide not included)",
                self._model_labels,
                registry=self.registry,
            )
        return self._window

    @property
    def accuracy(self) -> Gauge:
        """``stream_svm_progressive_accuracy``, registered on first use: only a classifier has
        it (NaN until a label is scored)."""
        if self._accuracy is None:
            self._accuracy = Gauge(
                "stream_svm_progressive_accuracy",
                "Accuracy of test-then-train predictions (labels scored against the prediction "
                "made before learning)",
                self._model_labels,
                registry=self.registry,
            )
            if not self.per_model:
                self._accuracy.set(float("nan"))
        return self._accuracy

    @property
    def regression_errors(self) -> tuple[Gauge, Gauge]:
        """``stream_svm_progressive_mae`` and ``stream_svm_progressive_rmse``, registered on
        first use: only a regressor has them (a classifier has the accuracy)."""
        if self._errors is None:
            self._errors = (
                Gauge("stream_svm_progressive_mae",
                      "Mean absolute error of test-then-train predictions (each target against "
                      "the prediction made before learning it)", self._model_labels,
                      registry=self.registry),
                Gauge("stream_svm_progressive_rmse",
                      "Root mean squared error of test-then-train predictions",
                      self._model_labels, registry=self.registry),
            )
            for gauge in self._errors:
                if not self.per_model:
                    gauge.set(float("nan"))  # until a target is scored
        return self._errors

    @property
    def replica(self) -> tuple[Gauge, Counter, Histogram, Counter]:
        """``stream_svm_model_generation``, ``stream_svm_state_publish_total{outcome}``,
        ``stream_svm_state_restore_seconds`` and ``stream_svm_state_restores_total{outcome}``,
        registered on first use: only a learner that publishes its state and a predictor have
        them."""
        if self._replica is None:
            r = self.registry
            generation = Gauge(
                "stream_svm_model_generation",
                "Sequence of the model state a predictor serves, or a learner last published, "
                "within its epoch (0: none yet)",
                registry=r,
            )
            publish = Counter(
                "stream_svm_state_publish",
                "States a learner published on the state topic, by outcome (published; failed: "
                "retried at the next checkpoint; stale: another learner took the model over)",
                ["outcome"],
                registry=r,
            )
            for outcome in PUBLISH_OUTCOMES:
                publish.labels(outcome=outcome)
            restore_seconds = Histogram(
                "stream_svm_state_restore_seconds",
                "Wall time of one read of the state topic to its end: by a predictor (to its "
                "newest state), or by a daemon with model.scope partition or key when it is "
                "assigned partitions (to the states of their models)",
                buckets=_SECONDS_BUCKETS,
                registry=r,
            )
            restores = Counter(
                "stream_svm_state_restores",
                "Reads of the state topic by a predictor, by outcome (newer: swapped in; "
                "unchanged; none: no state yet; refused: a state it cannot serve; failed: the "
                "topic could not be read)",
                ["outcome"],
                registry=r,
            )
            for outcome in RESTORE_OUTCOMES:
                restores.labels(outcome=outcome)
            self._replica = (generation, publish, restore_seconds, restores)
        return self._replica

    @property
    def scale_out(self) -> tuple[Gauge, Counter, Counter, Counter, Counter]:
        """``stream_svm_models`` (live models in this process),
        ``stream_svm_rebalances_total{kind}`` (the consumer group gave this process partitions
        or took them), ``stream_svm_model_evictions_total`` and
        ``stream_svm_model_fetches_total`` and ``stream_svm_model_fetch_failures_total``,
        registered on first use: only a daemon with ``model.scope`` partition or key has
        them."""
        if self._scale_out is None:
            r = self.registry
            self._scale_out = (
                Gauge("stream_svm_models",
                      "Models live in this process (at most model.max_models; others are on "
                      "the state topic until their next message)", registry=r),
                Counter("stream_svm_rebalances",
                        "Rebalances of the consumer group that changed this process's "
                        "partitions, by kind (assigned; revoked: handed over; lost: taken "
                        "while this process missed its session)", ["kind"], registry=r),
                Counter("stream_svm_model_evictions",
                        "Models published and dropped from memory to stay within "
                        "model.max_models", registry=r),
                Counter("stream_svm_model_fetches",
                        "Models read back on their first message in this process (after an "
                        "eviction or a move), by source: the state topic, or local disk "
                        "(an evicted model, with checkpoint.dir set)", ["source"], registry=r),
                Counter("stream_svm_model_fetch_failures",
                        "Attempts to read a model back from the state topic that failed (its "
                        "messages wait and are read again): the broker did not answer in "
                        "time, or no whole state of the model was found", registry=r),
            )
            for source in ("topic", "disk"):
                self._scale_out[3].labels(source=source)
            for kind in ("assigned", "revoked", "lost"):
                self._scale_out[1].labels(kind=kind)
        return self._scale_out

    def count_messages(self, outcome: str, times: int = 1) -> None:
        """``stream_svm_messages{outcome}`` += ``times``."""
        child = self._outcomes.get(outcome)
        if child is None:
            child = self._outcomes[outcome] = self.messages.labels(outcome=outcome)
        child.inc(times)

    def count_scored(self, correct: str) -> None:
        """``stream_svm_progressive_predictions{correct}`` += 1 (``true``, ``false``, or
        ``na`` for a regressor)."""
        self._scored[correct].inc()

    #: Gauges that describe one model: labelled by ``model`` when ``per_model``.
    MODEL_GAUGES = ("margin", "error", "reserve", "stored", "feature_names", "cached",
                    "cached_bytes", "held", "window", "accuracy")

    def for_model(self, label: str) -> Any:
        """The metrics as one model's processor sees them: the gauges of
        :attr:`MODEL_GAUGES` (and the progressive MAE and RMSE) with ``model=label``, every
        other metric shared. Without ``per_model``: these metrics themselves."""
        return _ModelMetrics(self, label) if self.per_model else self

    def forget_model(self, label: str) -> None:
        """Remove a model's labelled gauges (evicted, or its partition moved away), so that
        the number of series stays bounded by the live models."""
        families = [getattr(self, name) for name in self.MODEL_GAUGES
                    if name not in ("window", "accuracy")]
        families += [f for f in (self._window, self._accuracy) if f is not None]
        families += list(self._errors or ())
        for family in families:
            try:
                family.remove(label)
            except KeyError:
                pass

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` in a background thread; returns the bound port
        (useful with port 0)."""
        try:
            server, thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise OSError(
                f"cannot serve metrics at {host}:{port}: {exc.strerror or exc} (set metrics.port "
                "or --metrics-port; 0 picks a free port)"
            ) from None
        self._server = (server, thread)
        bound = int(server.server_address[1])
        log.info("serving metrics at http://%s:%d/metrics", host, bound)
        return bound

    def close(self) -> None:
        if self._server is not None:
            server, thread = self._server
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
            self._server = None


class _ModelMetrics:
    """One model's view of :class:`Metrics` (see :meth:`Metrics.for_model`)."""

    def __init__(self, metrics: Metrics, label: str) -> None:
        self._metrics = metrics
        self._label = label

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._metrics, name)
        if name in Metrics.MODEL_GAUGES:
            return found.labels(model=self._label)
        if name == "regression_errors":
            return tuple(gauge.labels(model=self._label) for gauge in found)
        return found
