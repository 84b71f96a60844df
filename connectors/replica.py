"""Prediction replicas of one global model, carried by the state topic.

A learner (``daemon.role = "learner"`` with ``kafka.publish_state = true``) publishes its model
on ``kafka.state_topic`` (a :class:`connectors.state_store.StateStore`) at every checkpoint, as
the model id :data:`GLOBAL_MODEL_ID`. Predictors (``daemon.role = "predictor"``) read the topic
every ``predictor.refresh_seconds`` in a thread of their own (:class:`StateFollower`), build a
processor that never learns from the newest state, and the daemon swaps it in between two polls.

A state is the model's ``to_checkpoint()`` arrays with the metadata of :func:`state_of`: the
model's metadata, the settings it was made with, its update count, the frozen scaler
statistics and the learner's next offset per partition. Its *generation* is
``"<epoch>.<sequence>"``: the epoch a learner claimed when it started (a newer learner of the
model has a higher one) and the number of the state within that epoch (1, 2, ...).

>>> generation(3, 12)
'3.12'
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from connectors.config import Config, kafka_client_settings
from connectors.metrics import Metrics
from connectors.models import (
    checkpoint_bounds,
    checkpointed_settings,
    restore_model,
    settings_mismatch,
)
from connectors.processor import Processor
from connectors.state_store import StateStore, StateStoreError, StoredState

__all__ = [
    "GLOBAL_MODEL_ID",
    "STATE_FORMAT",
    "StateFollower",
    "StateRefused",
    "generation",
    "processor_from_state",
    "state_of",
    "state_store_for",
]

log = logging.getLogger(__name__)

#: The model id of the daemon's one model on the state topic (``["global", null]`` in JSON).
GLOBAL_MODEL_ID: tuple[str, None] = ("global", None)
#: Version of the metadata layout of :func:`state_of`.
STATE_FORMAT = 1
#: Client settings the state store sets itself (bounded by its own timeout).
_STORE_OWN = ("bootstrap_servers", "request_timeout_ms", "bootstrap_timeout_ms",
              "reconnect_backoff_max_ms")


class StateRefused(ValueError):
    """A published state this daemon cannot serve (other settings, another format); the
    message says why."""


def generation(epoch: int, sequence: int) -> str:
    """The ``model_generation`` of a state."""
    return f"{epoch}.{sequence}"


def state_store_for(config: Config) -> StateStore:
    """A store on ``kafka.state_topic`` with the daemon's client settings (TLS, SASL, client
    id); every wait bounded by ``kafka.request_timeout_ms``."""
    client = kafka_client_settings(config)
    options = {key: value for key, value in client.items() if key not in _STORE_OWN}
    return StateStore(
        ",".join(client["bootstrap_servers"]), config.kafka.state_topic,
        client_options=options, timeout=config.kafka.request_timeout_ms / 1000,
    )


def state_of(processor: Processor, config: Config
             ) -> tuple[dict[str, np.ndarray], dict[str, Any], int]:
    """``(arrays, metadata, next_offset)`` of the learner's model to publish. ``next_offset``
    is the sum of the next offsets over the partitions read (one number is all the store
    keeps); ``metadata["offsets"]`` has them per partition. The unlabelled cache and held
    messages stay local: a predictor does not learn."""
    arrays, model_meta = processor.model.to_checkpoint()
    metadata = {
        "format": STATE_FORMAT,
        "model_meta": model_meta,
        "model_settings": checkpointed_settings(config),
        # (who published it: a state topic shared by two groups by mistake is named as such)
        "group_id": config.kafka.group_id,
        "input_topic": config.kafka.input_topic,
        "updates": processor.updates,
        # (what its predictions reflect: 0 while every sample learned waits in its buffer)
        "model_updates": processor.model_updates,
        "offsets": dict(processor.offsets),
        "scaler": None if processor.scaler is None else processor.scaler.state(),
    }
    return arrays, metadata, sum(processor.offsets.values())


def processor_from_state(config: Config, state: StoredState,
                         new_processor: Callable[[Any], Processor]) -> Processor:
    """A processor serving the published ``state`` (built by ``new_processor(model)`` with
    the configured scaler), its ``generation`` and update count set. Raises
    :class:`StateRefused` when the state was made with other ``[model]`` or ``[scaler]``
    settings than this daemon's, or cannot be read."""
    metadata = state.metadata
    where = f"state {generation(state.epoch, state.sequence)} on {config.kafka.state_topic}"
    if metadata.get("format") != STATE_FORMAT:
        raise StateRefused(f"{where} has format {metadata.get('format')!r}; this stream-svm "
                           f"reads format {STATE_FORMAT}")
    changed = settings_mismatch(metadata.get("model_settings"), checkpointed_settings(config))
    if changed is not None:
        raise StateRefused(
            f"{where} holds a model made with other settings than this predictor's "
            f"({changed}): give the predictor its learner's [model] and [scaler] settings"
        )
    try:
        check = checkpoint_bounds(config)
        for name, array in state.arrays.items():
            check(name, array.dtype, array.shape)
        model = restore_model(config, state.arrays, metadata["model_meta"])
        processor = new_processor(model)
        if processor.scaler is not None:
            processor.scaler.load_state(metadata["scaler"])
            if not processor.scaler.frozen:
                raise ValueError("its scaler is still warming up")
        processor.updates = int(metadata["updates"])
    except StateRefused:
        raise
    except Exception as exc:  # a state that does not load is refused, not served
        raise StateRefused(f"{where} cannot be served: {type(exc).__name__}: {exc}") from None
    processor.generation = generation(state.epoch, state.sequence)
    return processor


class StateFollower:
    """Reads the state topic every ``refresh_seconds`` in a thread of its own (the store is
    not thread-safe; this thread is its only user) and keeps the processor of the newest
    state it can serve for the daemon to :meth:`take` between two polls."""

    def __init__(
        self,
        config: Config,
        new_processor: Callable[[Any], Processor],
        metrics: Metrics,
        stop: threading.Event,
    ) -> None:
        self.config = config
        self.new_processor = new_processor
        self.metrics = metrics
        self.stop_event = stop
        #: (epoch, sequence) of the newest state built (served or waiting to be taken)
        self.newest: tuple[int, int] | None = None
        #: the state topic's id when the newest state seen (served, refused or empty) was read
        self._seen_topic: str | None = None
        #: (epoch, sequence) of the state last taken (served)
        self.taken: tuple[int, int] | None = None
        self._ready: Processor | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last_problem: str | None = None
        #: (epoch, sequence) of the newest state refused: not rebuilt at every refresh
        self._refused: tuple[int, int] | None = None
        #: (epoch, sequence) of the newest state of a model that has learned nothing (an idle
        #: learner's checkpoint): not served, not read again
        self._empty: tuple[int, int] | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="state-follower", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def take(self) -> Processor | None:
        """The processor of a state newer than the last one taken, or None; ``taken`` is
        then its (epoch, sequence)."""
        with self._lock:
            ready, self._ready = self._ready, None
            if ready is not None:
                self.taken = self.newest
        return ready

    def _run(self) -> None:
        store = state_store_for(self.config)
        try:
            while not self.stop_event.is_set():
                try:
                    self.refresh(store)
                except Exception:
                    # A bug here must not leave the predictor serving one model for ever
                    # without a word: logged, counted, tried again at the next refresh.
                    log.exception("reading the state topic %s failed unexpectedly",
                                  self.config.kafka.state_topic)
                    self.metrics.replica[3].labels(outcome="failed").inc()
                self.stop_event.wait(self.config.predictor.refresh_seconds)
        finally:
            store.close()

    def refresh(self, store: StateStore) -> str:
        """Read the topic once; returns the outcome (``newer``, ``unchanged``, ``none``,
        ``refused`` or ``failed``), also counted in ``stream_svm_state_restores_total``."""
        _, _, seconds, outcomes = self.metrics.replica
        started = time.perf_counter()
        try:
            # Only what was written since the last refresh is read, and no state is decoded
            # again unless it is newer than the one built.
            state = store.follow(GLOBAL_MODEL_ID, newer_than=self._seen())
        except StateStoreError as exc:
            self._problem(f"{exc} (a learner with kafka.publish_state = true creates and writes "
                          f"it); retried every {self.config.predictor.refresh_seconds:g} s")
            outcomes.labels(outcome="failed").inc()
            return "failed"
        finally:
            seconds.observe(time.perf_counter() - started)
        topic_id = getattr(store, "topic_id", None)
        if (state is not None and topic_id is not None and self._seen_topic is not None
                and topic_id != self._seen_topic):
            # The state topic was recreated (a broker that lost its data, or deleted): a new
            # learner's epochs start again at 0 there, below the states seen before (served,
            # refused, or of a model that had learned nothing), whose states were all taken
            # for older ones, silently, until its sequence caught up.
            if self.newest is not None:
                log.warning("state topic %s has the id %s, the model served was read when it "
                            "had %s: it was recreated; following the states written there "
                            "since", self.config.kafka.state_topic, topic_id, self._seen_topic)
            with self._lock:
                self.newest = None
            self._empty = self._refused = None
        if state is not None:
            self._seen_topic = topic_id
        if state is not None and state.metadata.get(
                "model_updates", state.metadata.get("updates")) == 0:
            # A learner that has learned nothing yet publishes at its checkpoints too: its
            # empty model answered every input with score 0, where a predictor waits for a
            # model (or keeps serving the one it has). Samples a sliding window or alpha-ISVM
            # holds in its buffer are not learned yet (states of older versions tell only
            # ``updates``, buffered samples included).
            if self._empty is None or (state.epoch, state.sequence) > self._empty:
                log.info("state %s on %s holds a model that has learned nothing yet: not "
                         "served", generation(state.epoch, state.sequence),
                         self.config.kafka.state_topic)
            self._empty = (state.epoch, state.sequence)
            state = None
        if state is None and self._refused is not None and self._refused == self._seen():
            # (The newest state is one refused: not read again, still not served.)
            outcomes.labels(outcome="refused").inc()
            return "refused"
        if state is None:
            outcome = "none" if self.newest is None else "unchanged"
        elif self.newest is not None and (state.epoch, state.sequence) <= self.newest:
            outcome = "unchanged"
        elif (state.epoch, state.sequence) == self._refused:
            outcomes.labels(outcome="refused").inc()
            return "refused"
        else:
            try:
                processor = processor_from_state(self.config, state, self.new_processor)
            except StateRefused as exc:
                self._problem(f"{exc}; not served")
                self._refused = (state.epoch, state.sequence)
                outcomes.labels(outcome="refused").inc()
                return "refused"
            with self._lock:  # together: take() must never see the one without the other
                self._ready = processor
                self.newest = (state.epoch, state.sequence)
            outcome = "newer"
        if outcome != "refused":
            self._last_problem = None
        outcomes.labels(outcome=outcome).inc()
        return outcome

    def _seen(self) -> tuple[int, int] | None:
        """(epoch, sequence) of the newest state read: served, refused, or of a model that
        had learned nothing; None before the first."""
        seen = [state for state in (self.newest, self._refused, self._empty) if state is not None]
        return max(seen, default=None)

    def _problem(self, text: str) -> None:
        """Log a problem once while it lasts (it is retried every refresh)."""
        if text != self._last_problem:
            # Before its first model a predictor waits for its learner: not yet an error.
            log.log(logging.WARNING if self.newest is None else logging.ERROR, "%s", text)
            self._last_problem = text
