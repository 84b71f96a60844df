"""Settings of the daemon: a TOML file, overridden by command-line flags, overridden by the
environment (``STREAM_SVM_<SECTION>_<KEY>``).

Every setting is declared once in :data:`SCHEMA` with its type, default and check; an unknown or
invalid setting fails at start with a message naming it and where it came from.

>>> env = {"STREAM_SVM_MODEL_GAMMA": "0.5"}
>>> config = load_config(None, overrides={"model.C": "2.5"}, environ=env)
>>> config.model.C, config.model.gamma, config.kafka.input_topic
(2.5, 0.5, 'stream-svm.input')
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["SCHEMA", "Config", "ConfigError", "Setting", "bootstrap_servers_problem",
           "kafka_client_settings", "load_config", "tls_context", "topic_name_problem"]

ENV_PREFIX = "STREAM_SVM_"

log = logging.getLogger("stream_svm.config")
#: Credentials are read from these variables only, never from a file or a flag.
SASL_USERNAME_ENV = "STREAM_SVM_SASL_USERNAME"
SASL_PASSWORD_ENV = "STREAM_SVM_SASL_PASSWORD"


class ConfigError(ValueError):
    """An invalid or unknown setting; the message names it."""


@dataclass(frozen=True)
class Setting:
    type: type
    default: Any
    check: Callable[[Any], str | None] | None = None
    optional: bool = False  # whether "" / missing means "not set" (None)


def _given_here(source: str) -> bool:
    """Whether a setting's source is a flag or an environment variable, which give it to this
    process alone (not a file, which may serve others)."""
    return source == "flag" or source.startswith("env ")


def _text_hint(name: str) -> str:
    """What a text in place of a number is told, where more can be said."""
    if name != "model.gamma":
        return ""
    from stream_svm.kernels import GAMMA_TEXT_HINT  # (the library only when it is needed)

    return f" ({GAMMA_TEXT_HINT})"


def _positive(value: float) -> str | None:
    return None if value > 0 else "must be > 0"


def _non_negative(value: float) -> str | None:
    return None if value >= 0 else "must be >= 0"


#: The largest value of a 32-bit field of Kafka's protocol (timeouts, sizes, counts).
KAFKA_INT32_MAX = 2**31 - 1
#: The longest wait any setting may ask for (about 31 years: "never"): beyond it the waits of
#: Python's threads and the clocks they are computed from overflow.
MAX_SECONDS = 1e9
#: The largest configuration file read.
MAX_CONFIG_BYTES = 1 << 20
#: The most random Fourier features a daemon's LS-SVM may have.
MAX_COMPONENTS = 10_000
#: The longest kafka.poll_timeout_ms: a stop waits for the poll under way.
MAX_POLL_TIMEOUT_MS = 10_000


def _positive_int32(value: int) -> str | None:
    if value <= 0:
        return "must be > 0"
    return None if value <= KAFKA_INT32_MAX else (
        f"must be at most {KAFKA_INT32_MAX} (a 32-bit field of Kafka's protocol)")


#: The smallest kafka.max_message_bytes: a dead letter (its error and source, its raw bytes
#: cut to fit) takes about 300 bytes at the least.
MIN_MESSAGE_BYTES = 512


def _message_limit(value: int) -> str | None:
    # (10 was taken, and every message was dead-lettered, its raw bytes cut to nothing)
    if 0 < value < MIN_MESSAGE_BYTES:
        return (f"must be at least {MIN_MESSAGE_BYTES} bytes: an output or a dead letter must "
                "fit in it (Kafka's default is 1000012)")
    return _positive_int32(value)


#: The names of the variables Kubernetes sets in every pod for each Service of its namespace
#: (a Service "stream-svm": STREAM_SVM_PORT=tcp://10.0.0.7:9464, STREAM_SVM_SERVICE_HOST, ...).
_SERVICE_LINK = re.compile(
    r"_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_\d+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)?)$")


def _service_link(variable: str, value: str) -> bool:
    """Whether ``variable`` is one Kubernetes set for a Service (named like this program): not
    a setting, even where its name is one's (STREAM_SVM_METRICS_PORT=tcp://... for a Service
    "stream-svm-metrics"). Such variables stopped the daemon's start in any namespace with a
    Service so named (the pod's default, enableServiceLinks)."""
    if not _SERVICE_LINK.search(variable):
        return False
    if variable.endswith("_PORT") and "_SERVICE_" not in variable and "_TCP_" not in variable \
            and "_UDP_" not in variable and "_SCTP_" not in variable:
        # <SERVICE>_PORT is always a URL: a number under such a name is a setting, or a
        # misspelt one (STREAM_SVM_METRIC_PORT=9000), checked as such
        return value.startswith(("tcp://", "udp://", "sctp://"))
    return True


def _non_negative_int32(value: int) -> str | None:
    return None if value == 0 else _positive_int32(value)


def _seconds(value: float) -> str | None:
    if value <= 0:
        return "must be > 0"
    return None if value <= MAX_SECONDS else f"must be at most {MAX_SECONDS:g} seconds"


def _non_negative_seconds(value: float) -> str | None:
    return None if value == 0 else _seconds(value)


def _at_most(high: int, why: str) -> Callable[[int], str | None]:
    def check(value: int) -> str | None:
        if value <= 0:
            return "must be > 0"
        return None if value <= high else f"must be at most {high} ({why})"

    return check


def _poll_timeout(value: int) -> str | None:
    if not 0 <= value <= MAX_POLL_TIMEOUT_MS:
        return f"must be in [0, {MAX_POLL_TIMEOUT_MS}] (a stop waits for the poll under way)"
    return None


def _client_id(value: str) -> str | None:
    # Kafka's protocol carries it as a string of at most 32767 bytes: a longer one broke every
    # request, and the client reconnected for ever without naming the setting.
    return None if len(value.encode("utf-8")) <= 32767 else "must be at most 32767 bytes long"


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(value: str) -> str | None:
        return None if value in choices else f"must be one of {', '.join(choices)}"

    return check


def _between(low: float, high: float, *, high_open: bool = False
             ) -> Callable[[float], str | None]:
    def check(value: float) -> str | None:
        inside = low <= value < high if high_open else low <= value <= high
        return None if inside else f"must be in [{low}, {high}{')' if high_open else ']'}"

    return check


def _two_classes(value: list) -> str | None:
    if len(value) != 2:
        return "must be two labels [negative, positive]"
    for label in value:
        if isinstance(label, float) and not math.isfinite(label):
            return "must hold finite labels"
        if not isinstance(label, (str, int, float, bool)):
            return "must hold strings, numbers or booleans"
    if value[0] == value[1] and type(value[0]) is type(value[1]):
        return "must be two distinct labels"
    return None


def _finite_numbers(value: dict) -> str | None:
    for name, number in value.items():
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(
                number):
            return f"must map feature names to finite numbers ({name!r} is not)"
    return None


def _ipv6(text: str) -> bool:
    import socket

    try:
        socket.inet_pton(socket.AF_INET6, text)
    except (OSError, ValueError):
        return False
    return True


def bootstrap_servers_problem(value: str) -> str | None:
    """host:port entries, comma-separated (a port may be left out: 9092; an IPv6 address with a
    port in brackets, [::1]:9092; a PROTOCOL:// prefix is ignored, as Kafka's clients do)."""
    if not value.replace(",", "").strip():
        return "must name at least one host:port"
    for entry in value.split(","):
        if not entry.strip():
            continue  # (an empty entry, a trailing comma: Kafka's clients skip it)
        if ";" in entry or (" " in entry.strip()):
            return (f"must be host:port entries separated by commas: {entry.strip()!r} holds "
                    "several (a ';' or a space)")
        server = entry.strip().split("://")[-1]
        if server.startswith("["):
            host, closed, rest = server[1:].partition("]")
            if not closed or (rest and not rest.startswith(":")):
                return f"must be host:port entries: {entry.strip()!r} is not [IPv6]:port"
            port = rest[1:] if rest else "9092"
        elif server.count(":") == 1:
            host, port = server.split(":")
        else:  # a host without port, or a bare IPv6 address
            host, port = server, "9092"
            if ":" in host and not _ipv6(host):
                return f"must be host:port entries: {entry.strip()!r} is not an IPv6 address"
        if not host or not host.isprintable() or any(c.isspace() for c in host):
            return f"must be host:port entries: {entry.strip()!r} has no usable host"
        if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            return f"must be host:port entries: {entry.strip()!r} has no port in 1-65535"
    return None


def _positive_numbers(value: dict) -> str | None:
    problem = _finite_numbers(value)
    if problem is None and any(number <= 0 for number in value.values()):
        return "must map feature names to numbers > 0"
    return problem


#: The estimators the daemon serves (``model.type``).
#: Values of model.scope.
SCOPES = ("global", "partition", "key")
ROLES = ("learner", "predictor")
#: model.* settings that configure the daemon's models, not a model's constructor.
DAEMON_MODEL_SETTINGS = ("scope", "max_models")
MODEL_TYPES = ("IncrementalSVC", "SlidingWindowSVC", "AlphaISVC", "IncrementalLSSVC",
               "IncrementalLSSVR", "IncrementalSVR", "SlidingWindowSVR")
#: The regressors among them (their labels are numbers).
REGRESSOR_TYPES = ("IncrementalLSSVR", "IncrementalSVR", "SlidingWindowSVR")


def _port(value: int) -> str | None:
    return None if 0 <= value <= 65535 else "must be a TCP port (0-65535; 0 picks a free one)"


def topic_name_problem(value: str) -> str | None:
    """What makes ``value`` no Kafka topic name, or None.

    >>> topic_name_problem("stream-svm.input"), topic_name_problem("bad topic!")
    (None, "must be a Kafka topic name (letters, digits, '.', '_', '-'; at most 249)")
    """
    if not value:
        return "must not be empty"
    if value in (".", ".."):
        return "must not be '.' or '..' (Kafka refuses them)"
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    if len(value) > 249 or not set(value) <= allowed:
        return "must be a Kafka topic name (letters, digits, '.', '_', '-'; at most 249)"
    return None


#: kafka.fetch_max_wait_ms when it is unset and kafka.poll_timeout_ms is not lower.
FETCH_MAX_WAIT_MS = 50
#: kafka-python closes idle connections after this (its default), and refuses a request
#: timeout that is not below it.
KAFKA_CONNECTIONS_MAX_IDLE_MS = 540_000
#: How long the Kafka client's producer tries to deliver a record (its default).
KAFKA_DELIVERY_TIMEOUT_MS = 120_000

SCHEMA: dict[str, dict[str, Setting]] = {
    "kafka": {
        "bootstrap_servers": Setting(str, "", bootstrap_servers_problem, optional=True),
        "input_topic": Setting(str, "stream-svm.input", topic_name_problem),
        "label_topic": Setting(str, "", topic_name_problem, optional=True),
        "output_topic": Setting(str, "stream-svm.predictions", topic_name_problem),
        "dead_letter_topic": Setting(str, "stream-svm.dead-letters", topic_name_problem),
        "group_id": Setting(str, "stream-svm", lambda v: None if v else "must not be empty"),
        "client_id": Setting(str, "stream-svm", _client_id),
        "create_topics": Setting(bool, True),
        "topic_partitions": Setting(int, 1, _positive_int32),
        "security_protocol": Setting(
            str, "PLAINTEXT", _one_of("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
        ),
        "ssl_cafile": Setting(str, "", optional=True),
        "ssl_certfile": Setting(str, "", optional=True),
        "ssl_keyfile": Setting(str, "", optional=True),
        "sasl_mechanism": Setting(
            str, "", _one_of("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"), optional=True
        ),
        "request_timeout_ms": Setting(int, 30000, _positive_int32),
        "poll_timeout_ms": Setting(int, 100, _poll_timeout),
        # The longest a broker holds a fetch that finds no new message. Kafka answers as soon
        # as a message arrives; brokers that do not (Tansu, the embedded broker) answer at the
        # end of the wait, which then bounds the latency. Unset: 50, or poll_timeout_ms when
        # that is lower (at least 1; below request_timeout_ms), resolved in load_config.
        "fetch_max_wait_ms": Setting(int, None, _positive_int32, optional=True),
        "max_batch": Setting(int, 500, _at_most(1_000_000, "messages handled per poll")),
        "predict_per_poll": Setting(bool, False),
        "max_message_bytes": Setting(int, 1_000_000, _message_limit),
        # The most bytes a compressed record batch may inflate to (connectors.inflate): beyond,
        # its records are dead-lettered unreadable instead of filling the memory.
        "max_inflated_batch_bytes": Setting(int, 256 * 1024 * 1024, _positive),
        "linger_ms": Setting(int, 2, _non_negative_int32),
        "isolation_level": Setting(str, "read_committed",
                                   _one_of("read_committed", "read_uncommitted")),
        "on_partition_reset": Setting(
            str, "stop", _one_of("stop", "earliest", "latest", "resume")
        ),
        # The compacted topic carrying the model's state from a learner to its predictors
        # (connectors.state_store). Unset: "<group_id>.state", resolved in load_config.
        "state_topic": Setting(str, "", topic_name_problem, optional=True),
        # A learner publishes its state there at every checkpoint (off by default: a learner
        # that nobody reads from changes nothing).
        "publish_state": Setting(bool, False),
        # Consumer-group membership (model.scope partition or key): a member that sends no
        # heartbeat for session_timeout_ms is dropped and its partitions move to the others.
        "session_timeout_ms": Setting(int, 10_000, _positive_int32),
        "heartbeat_interval_ms": Setting(int, 3_000, _positive_int32),
    },
    # "learner": consumes, predicts, learns and checkpoints (one per model). "predictor": a
    # replica that answers the input topic with the newest state a learner published on
    # kafka.state_topic, never learns and writes no checkpoint.
    "daemon": {
        "role": Setting(str, "learner", _one_of(*ROLES)),
    },
    "predictor": {
        # How often a predictor reads the state topic for a newer state.
        "refresh_seconds": Setting(float, 1.0, _seconds),
        # How long a predictor without any state waits for a first one (consuming nothing)
        # before it stops with an error; 0: no bound.
        "max_wait_seconds": Setting(float, 300.0, _non_negative_seconds),
    },
    # Each setting applies to the model types whose constructor has a parameter of its name
    # (connectors.models); setting one that does not apply to model.type is an error.
    "model": {
        "type": Setting(str, "IncrementalSVC", _one_of(*MODEL_TYPES)),
        # One model for the whole stream ("global"), one per input partition, or one per
        # message key within each partition; the latter two share the partitions among the
        # daemons of one kafka.group_id and keep every model's state on kafka.state_topic.
        "scope": Setting(str, "global", _one_of(*SCOPES)),
        # Live models per process (scope partition or key): the least recently used one is
        # published and evicted, and restored from the state topic on its next message.
        "max_models": Setting(int, 1000, _positive),
        "C": Setting(float, 1.0, _positive),
        "kernel": Setting(str, "rbf", _one_of("rbf", "linear", "poly")),
        "gamma": Setting(float, 1.0, _positive),
        "degree": Setting(int, 3, _positive),
        "coef0": Setting(float, 0.0),
        "reserve_epsilon": Setting(float, None, _non_negative, optional=True),
        "epsilon": Setting(float, 0.1, _non_negative),
        "ridge": Setting(float, 0.0, _non_negative),
        "max_breakpoints": Setting(int, None, _at_most(2**62, "path steps per update"),
                                   optional=True),
        "classes": Setting(list, None, _two_classes, optional=True),
        "window_size": Setting(int, 1000, _positive),
        "step": Setting(int, 1, _positive),
        "strategy": Setting(str, "multiple", _one_of("multiple", "single")),
        "discard_ratio": Setting(float, 0.5, _between(0.0, 1.0)),
        "cache_ratio": Setting(float, 0.5, _between(0.0, 1.0)),
        "weight_decay": Setting(float, 0.9, _between(0.5, 1.0, high_open=True)),
        "weight_increment": Setting(float, 1.0, _positive),
        "weight_threshold": Setting(float, 0.5, _positive),
        "max_rounds": Setting(int, 50, _positive),
        "batch_size": Setting(int, 100, _positive),
        "validation_margin": Setting(float, 0.0, _between(0.0, 1.0)),
        "rho": Setting(float, 1.0, _positive),
        "features": Setting(str, "linear", _one_of("linear", "rff")),
        "n_components": Setting(int, 100, _at_most(
            MAX_COMPONENTS, "the state is 16 (n_components + 1)^2 bytes: 1.6 GB at the most")),
        "fit_intercept": Setting(bool, True),
        "seed": Setting(int, None, optional=True),
        # Unset: the model's own default (10,000 for the SVMs, 1,000 for the LS-SVMs, whose
        # state is a matrix over the features); 0: no bound.
        "max_features": Setting(int, None, _non_negative, optional=True),
        "max_new_features": Setting(int, 1000, _non_negative),
        # A point far beyond the stored points' kernel scale (linear and polynomial kernels):
        # "refuse" dead-letters it (reason refused), "warn" learns it (see the README).
        "far_points": Setting(str, "refuse", _one_of("warn", "refuse")),
    },
    # Standardization before the model, with statistics that never move once learning starts
    # (connectors.scaling): "warmup" measures them on the first warmup_messages feature
    # messages (held, then processed), "fixed" takes means and scales as given.
    "scaler": {
        "mode": Setting(str, "none", _one_of("none", "warmup", "fixed")),
        # A feature message with a feature the statistics do not name (not in scaler.scales
        # or scaler.means, or not seen during the warm-up): "pass" lets it through unscaled
        # (named once in the log), "dead_letter" refuses the message (reason unknown_feature),
        # so that a misspelt feature name is never learned.
        "unknown_features": Setting(str, "pass", _one_of("pass", "dead_letter")),
        "warmup_messages": Setting(int, 1000, _positive),
        "means": Setting(dict, None, _finite_numbers, optional=True),
        "scales": Setting(dict, None, _positive_numbers, optional=True),
        # A regressor's targets standardized too: the model learns (y - mean) / scale (its C
        # and epsilon in those units) and predicts in y's units, with target_mean and
        # target_scale, or (unset, with mode "warmup") statistics measured on the warm-up's
        # labelled feature messages.
        "targets": Setting(bool, False),
        "target_mean": Setting(float, None, optional=True),
        "target_scale": Setting(float, None, _positive, optional=True),
    },
    "cache": {
        "max_size": Setting(int, 100_000, _non_negative),
        "max_bytes": Setting(int, 256 * 2**20, _non_negative),
        "max_age_seconds": Setting(float, 3600.0, _seconds),
    },
    "checkpoint": {
        "dir": Setting(str, "stream-svm-checkpoints", lambda v: None if v else "must not be empty"),
        "every_messages": Setting(int, 5000, _positive),
        "every_seconds": Setting(float, 30.0, _seconds),
        "keep": Setting(int, 3, _positive),
        "start_fresh": Setting(bool, False),
    },
    "metrics": {
        "enabled": Setting(bool, True),
        "host": Setting(str, "127.0.0.1", lambda v: None if v else "must not be empty"),
        "port": Setting(int, 9464, _port),
    },
    "retry": {
        "initial_backoff_seconds": Setting(float, 0.5, _at_most(
            86_400, "a day between attempts")),
        "max_backoff_seconds": Setting(float, 30.0, _at_most(
            86_400, "a day between attempts")),
        "max_attempts": Setting(int, 0, _non_negative),
    },
}


class Config(SimpleNamespace):
    """Settings by section: ``config.kafka.input_topic``; ``config.sources`` tells where each
    setting came from (``default``, the file, ``flag`` or ``env STREAM_SVM_...``)."""

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {section: dict(vars(getattr(self, section))) for section in SCHEMA}


def _convert(name: str, setting: Setting, raw: Any, source: str) -> Any:
    where = f"setting {name} (from {source})"
    if isinstance(raw, str) and _given_here(source):
        raw = _unquoted(raw)
    if setting.optional and (raw is None or raw == ""):
        return None
    kind = setting.type
    if (name == "kafka.bootstrap_servers" and isinstance(raw, list) and raw
            and all(isinstance(server, str) for server in raw)):
        # (a TOML array of servers, as kafka-python takes them: the same list, comma-joined)
        raw = ",".join(raw)
    if kind is list:
        return _convert_list(where, setting, raw)
    if kind is dict:
        return _convert_table(where, setting, raw)
    if isinstance(raw, str) and kind is not str:
        if not _given_here(source):
            # A TOML file says what it means: C = "5" is a quoted mistake, not a number.
            raise ConfigError(f"{where}: {raw!r} is a string; write the {kind.__name__} "
                              f"without quotes{_text_hint(name)}")
        text = raw.strip()
        if kind in (int, float) and (not text.isascii() or "_" in text):
            # (Python reads 1_0 as 10, and digits of every script as digits.)
            raise ConfigError(f"{where}: {raw!r} is not a valid {kind.__name__}")
        try:
            if kind is bool:
                lowered = text.lower()
                if lowered in ("1", "true", "yes", "on"):
                    return True
                if lowered in ("0", "false", "no", "off"):
                    return False
                raise ValueError(text)
            raw = kind(text)
        except ValueError:
            raise ConfigError(f"{where}: {raw!r} is not a valid {kind.__name__}"
                              f"{_text_hint(name)}") from None
    if kind is float and isinstance(raw, int) and not isinstance(raw, bool):
        raw = float(raw)
    if kind is bool and not isinstance(raw, bool):
        raise ConfigError(f"{where}: {raw!r} is not a boolean (true/false)")
    if kind is int and (isinstance(raw, bool) or not isinstance(raw, int)):
        raise ConfigError(f"{where}: {raw!r} is not an integer")
    if not isinstance(raw, kind) or (isinstance(raw, bool) and kind is not bool):
        raise ConfigError(f"{where}: {raw!r} is not a {kind.__name__}")
    if kind is float and not math.isfinite(raw):
        raise ConfigError(f"{where}: {raw!r} is not finite")
    return _checked(where, setting, raw)


def _unquoted(text: str) -> str:
    """A flag's or a variable's value written as a TOML string, as in the file
    (``kafka.group_id="g4"``), as the string it holds; any other text as it is. (The quotes
    were kept: the consumer group was literally "g4", quotes included.)"""
    stripped = text.strip()
    if len(stripped) >= 2 and stripped[0] == stripped[-1] and stripped[0] in "\"'":
        with contextlib.suppress(tomllib.TOMLDecodeError):
            value = tomllib.loads(f"value = {stripped}")["value"]
            if isinstance(value, str):
                return value
    return text


def _checked(where: str, setting: Setting, value: Any) -> Any:
    if setting.check is not None:
        problem = setting.check(value)
        if problem:
            raise ConfigError(f"{where}: {problem}, got {value!r}")
    return value


def _json_or_toml_value(text: str) -> Any:
    """A value written as JSON, or as the right-hand side of a TOML line (the file's own
    syntax: ``{ "1" = 0.0 }``); ValueError when it is neither."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        raise ValueError(text) from None


def _convert_table(where: str, setting: Setting, raw: Any) -> dict:
    """A TOML table, or from a flag or the environment its JSON text (``{"a": 1.5}``) or TOML
    inline table (``{ a = 1.5 }``)."""
    if isinstance(raw, str):
        try:
            raw = _json_or_toml_value(raw)
        except ValueError:
            raise ConfigError(f"{where}: {raw!r} is neither a JSON object ({{\"a\": 1.5}}) nor a "
                              "TOML inline table ({ a = 1.5 })") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: {raw!r} is not a table of feature name = number")
    return _checked(where, setting, {str(k): v for k, v in raw.items()})


def _convert_list(where: str, setting: Setting, raw: Any) -> list:
    """A TOML array, or from a flag or the environment its JSON (or TOML) text
    (``["ham", "spam"]``) or comma-separated strings (``ham,spam``)."""
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("["):
            try:
                raw = _json_or_toml_value(text)
            except ValueError:
                raise ConfigError(f"{where}: {raw!r} is not a JSON (or TOML) array") from None
        else:
            raw = [part.strip() for part in text.split(",")]
            for part in raw:
                try:
                    literal = json.loads(part)
                except ValueError:
                    continue
                if literal is None or isinstance(literal, (int, float, bool)):
                    # 0,1 could mean the numbers or the strings "0" and "1", and labels of
                    # messages are compared with their type: say which.
                    literals = json.dumps([json.loads(p) if _json_scalar(p) else p
                                           for p in raw])
                    strings = json.dumps(raw)
                    raise ConfigError(
                        f"{where}: {text!r} is ambiguous: write it as JSON, {literals} for "
                        f"those numbers or booleans, or {strings} for strings")
            raw = [_unquoted(part) for part in raw]  # ("ham","spam" as in the file)
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: {raw!r} is not a list")
    return _checked(where, setting, raw)


def _json_scalar(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _split(name: str) -> tuple[str, str]:
    section, _, key = name.partition(".")
    if section not in SCHEMA or key not in SCHEMA[section]:
        if section in SCHEMA:
            # A key of another section written in this one, or a misspelt key of this one.
            close = [f"{other}.{key}" for other in SCHEMA if key in SCHEMA[other]] or [
                f"{section}.{match}" for match in
                difflib.get_close_matches(key, list(SCHEMA[section]), n=2, cutoff=0.6)]
        else:
            every = [f"{s}.{k}" for s in SCHEMA for k in SCHEMA[s]]
            close = difflib.get_close_matches(name, every, n=2, cutoff=0.8)
        if close:
            hint = "did you mean " + " or ".join(repr(match) for match in close) + "?"
        elif section in SCHEMA:
            hint = f"the settings of [{section}] are " + ", ".join(SCHEMA[section])
        else:
            hint = "the sections are " + ", ".join(SCHEMA)
        raise ConfigError(f"unknown setting {name!r}; {hint}")
    return section, key


def load_config(
    path: str | os.PathLike[str] | None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Read the TOML file at ``path`` (None: defaults only), then apply ``overrides``
    (``{"section.key": value}``, from command-line flags), then ``STREAM_SVM_SECTION_KEY``
    variables of ``environ`` (default: ``os.environ``). Raises :class:`ConfigError`."""
    environ = os.environ if environ is None else environ
    raw: dict[str, tuple[Any, str]] = {}
    if path is not None:
        file = Path(path)
        try:
            with file.open("rb") as handle:
                # (Bounded: --config /dev/zero read until memory ran out.)
                data = handle.read(MAX_CONFIG_BYTES + 1)
            if len(data) > MAX_CONFIG_BYTES:
                raise ConfigError(f"config file {file} is larger than {MAX_CONFIG_BYTES} bytes: "
                                  "not a configuration")
            # A byte-order mark (some editors write one) is no TOML statement.
            document = tomllib.loads(data.decode("utf-8-sig"))
        except FileNotFoundError:
            raise ConfigError(f"config file {file} does not exist") from None
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {file} is not readable TOML: {exc}") from None
        for section, table in document.items():
            if not isinstance(table, dict):
                owners = [name for name in SCHEMA if section in SCHEMA[name]]
                raise ConfigError(f"{file}: top-level key {section!r} must be a [section]" + (
                    f"; {section} is a setting of [{owners[0]}]: put it in that section"
                    if len(owners) == 1 else ""))
            for key, value in table.items():
                _split(f"{section}.{key}")
                raw[f"{section}.{key}"] = (value, str(file))
    for name, value in (overrides or {}).items():
        _split(name)
        raw[name] = (value, "flag")
    for variable, value in environ.items():
        if not variable.startswith(ENV_PREFIX) or variable in (
            SASL_USERNAME_ENV,
            SASL_PASSWORD_ENV,
        ):
            continue
        if _service_link(variable, value):
            continue
        rest = variable[len(ENV_PREFIX) :].lower()
        for section in SCHEMA:
            if rest.startswith(section + "_"):
                key = rest[len(section) + 1 :]
                match = next((k for k in SCHEMA[section] if k.lower() == key), None)
                if match is None:
                    close = [f"{other}_{key}" for other in SCHEMA
                             if key in (k.lower() for k in SCHEMA[other])] or [
                        f"{section}_{k}" for k in difflib.get_close_matches(
                            key, [k.lower() for k in SCHEMA[section]], n=2, cutoff=0.6)]
                    hint = ("; did you mean " + " or ".join(
                        f"{ENV_PREFIX}{k.upper()}" for k in close) + "?"
                            if close else f"; the settings of [{section}] are "
                            + ", ".join(SCHEMA[section]))
                    raise ConfigError(f"environment variable {variable}: unknown setting "
                                      f"{section}.{key}{hint}")
                name = f"{section}.{match}"
                if name in raw and raw[name][1] == "flag":
                    log.warning("setting %s: environment variable %s overrides the flag's "
                                "value %r", name, variable, raw[name][0])
                raw[name] = (value, f"env {variable}")
                break
        else:
            # Other STREAM_SVM_ variables (the scripts' STREAM_SVM_VENV) are no settings, but
            # one whose first word is nearly a section's name is a misspelt setting, which
            # would otherwise leave its default in place without a word.
            flag = {"config": "--config FILE", "log_level": "--log-level"}.get(rest)
            if flag is not None:  # (read by nothing: the variable was ignored without a word)
                raise ConfigError(f"environment variable {variable} is no setting: give "
                                  f"{flag} on the command line")
            owners = [section for section in SCHEMA
                      if rest in {k.lower() for k in SCHEMA[section]}]
            if owners:
                # STREAM_SVM_GAMMA: a setting's name without its section, which would
                # otherwise be ignored without a word.
                meant = " or ".join(f"{ENV_PREFIX}{section.upper()}_{rest.upper()}"
                                    for section in owners)
                raise ConfigError(f"environment variable {variable} names no section: did you "
                                  f"mean {meant}?")
            word, _, key = rest.partition("_")
            for close in difflib.get_close_matches(word, list(SCHEMA), n=3, cutoff=0.75):
                keys = {k.lower(): k for k in SCHEMA[close]}
                meant = keys.get(key) or next(iter(
                    difflib.get_close_matches(key, list(keys), n=1, cutoff=0.8)), None)
                if key and meant:
                    raise ConfigError(
                        f"environment variable {variable}: unknown section {word!r}; did you "
                        f"mean {ENV_PREFIX}{close.upper()}_{meant.upper()}?"
                    )
    sections: dict[str, SimpleNamespace] = {}
    sources: dict[str, str] = {}
    for section, settings in SCHEMA.items():
        values = {}
        for key, setting in settings.items():
            name = f"{section}.{key}"
            value, source = raw.get(name, (setting.default, "default"))
            values[key] = _convert(name, setting, value, source)
            sources[name] = source
        sections[section] = SimpleNamespace(**values)
    config = Config(**sections, sources=sources)
    # Paths as a shell would give them: a file's or a variable's "~/checkpoints" reaches no
    # shell, and was a directory named "~" under the working directory; made absolute, the
    # messages that name a path say which directory it is.
    config.checkpoint.dir = _checkpoint_dir(config.checkpoint.dir)
    for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        if getattr(config.kafka, key):
            setattr(config.kafka, key, os.path.expanduser(getattr(config.kafka, key)))
    if config.kafka.state_topic is None:
        config.kafka.state_topic = f"{config.kafka.group_id}.state"
    if config.kafka.fetch_max_wait_ms is None:
        # A shorter poll timeout, set to cut latency, keeps cutting it on brokers that answer
        # an empty fetch only at the end of its wait.
        config.kafka.fetch_max_wait_ms = min(FETCH_MAX_WAIT_MS,
                                             max(1, config.kafka.poll_timeout_ms),
                                             max(1, config.kafka.request_timeout_ms - 1))
    _cross_checks(config)
    return config


def _checkpoint_dir(written: str) -> str:
    """checkpoint.dir as a shell gives it (absolute, a leading ~ the home directory);
    ConfigError when only the directory named literally holds checkpoints, as versions that
    took "~" literally left them (starting from the other would start a new model)."""
    directory = os.path.abspath(os.path.expanduser(written))
    literal = os.path.abspath(written)

    def holds_checkpoints(path: str) -> bool:
        with contextlib.suppress(OSError):
            return any(name.startswith("checkpoint-") for name in os.listdir(path))
        return False

    if (written.startswith("~") and literal != directory and holds_checkpoints(literal)
            and not holds_checkpoints(directory)):
        raise ConfigError(
            f"setting checkpoint.dir {written!r} is the directory {directory} (a leading ~ is "
            f"the home directory), which holds no checkpoint, but {literal} (named by the "
            "same text, read literally as earlier versions did) holds checkpoints: move them "
            f"to {directory}, or give checkpoint.dir = {literal!r}")
    return directory


def _cross_checks(config: Config) -> None:
    kafka = config.kafka
    topics = {
        "kafka.input_topic": kafka.input_topic,
        "kafka.output_topic": kafka.output_topic,
        "kafka.dead_letter_topic": kafka.dead_letter_topic,
    }
    if kafka.label_topic:
        topics["kafka.label_topic"] = kafka.label_topic
    _check_scope(config)  # first: a scope that needs a learner says so before the role's
    _check_role(config)
    if (kafka.publish_state or config.daemon.role == "predictor"
            or config.model.scope != "global"):
        topics["kafka.state_topic"] = kafka.state_topic
    seen: dict[str, str] = {}
    for name, topic in topics.items():
        if topic in seen:
            raise ConfigError(f"setting {name}: topic {topic!r} is already used by {seen[topic]}")
        seen[topic] = name
    if kafka.sasl_mechanism and not kafka.security_protocol.startswith("SASL"):
        raise ConfigError(
            "setting kafka.sasl_mechanism needs kafka.security_protocol SASL_PLAINTEXT or SASL_SSL"
        )
    if kafka.security_protocol.startswith("SASL") and not kafka.sasl_mechanism:
        # (the client then failed at every connection attempt, retried for ever as an
        # unreachable broker)
        raise ConfigError(
            f"setting kafka.security_protocol {kafka.security_protocol} needs "
            "kafka.sasl_mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
    if kafka.fetch_max_wait_ms >= kafka.request_timeout_ms:
        raise ConfigError(
            f"setting kafka.fetch_max_wait_ms ({kafka.fetch_max_wait_ms}, "
            f"{config.sources['kafka.fetch_max_wait_ms']}) must be below kafka.request_timeout_ms "
            f"({kafka.request_timeout_ms}, {config.sources['kafka.request_timeout_ms']}): a fetch "
            "is a request")
    if kafka.max_inflated_batch_bytes < kafka.max_message_bytes:
        raise ConfigError(
            f"setting kafka.max_inflated_batch_bytes ({kafka.max_inflated_batch_bytes}, "
            f"{config.sources['kafka.max_inflated_batch_bytes']}) must be at least "
            f"kafka.max_message_bytes ({kafka.max_message_bytes}, "
            f"{config.sources['kafka.max_message_bytes']}): a batch of one message that size "
            "must inflate")
    if kafka.linger_ms + kafka.request_timeout_ms > KAFKA_DELIVERY_TIMEOUT_MS:
        # (The Kafka client refused it only once connected, in its own words.)
        raise ConfigError(
            f"setting kafka.linger_ms ({kafka.linger_ms}) plus kafka.request_timeout_ms "
            f"({kafka.request_timeout_ms}) must be at most {KAFKA_DELIVERY_TIMEOUT_MS}, the Kafka "
            "client's delivery_timeout_ms: a record waits the linger, then its request")
    if kafka.request_timeout_ms >= KAFKA_CONNECTIONS_MAX_IDLE_MS:
        raise ConfigError(
            f"setting kafka.request_timeout_ms ({kafka.request_timeout_ms}) must be below "
            f"{KAFKA_CONNECTIONS_MAX_IDLE_MS}, the Kafka client's connections_max_idle_ms")
    if config.retry.max_backoff_seconds < config.retry.initial_backoff_seconds:
        raise ConfigError(
            "setting retry.max_backoff_seconds must be >= retry.initial_backoff_seconds"
        )
    scaler = config.scaler
    if scaler.mode == "fixed" and not scaler.scales:
        raise ConfigError("setting scaler.mode = \"fixed\" needs scaler.scales (and usually "
                          "scaler.means): a table of feature name = number")
    if scaler.mode != "fixed" and (scaler.means or scaler.scales):
        raise ConfigError("settings scaler.means and scaler.scales need scaler.mode = \"fixed\"")
    if scaler.mode == "none" and scaler.unknown_features != "pass":
        raise ConfigError("setting scaler.unknown_features = \"dead_letter\" needs scaler.mode "
                          "\"warmup\" or \"fixed\": the features it knows are those with "
                          "statistics")
    _check_target_scaling(config)
    if (scaler.mode != "warmup" and config.sources["scaler.warmup_messages"] != "default"
            and scaler.warmup_messages != SCHEMA["scaler"]["warmup_messages"].default):
        raise ConfigError("setting scaler.warmup_messages needs scaler.mode = \"warmup\"")
    from connectors.models import check_model_config  # models imports this module

    check_model_config(config)


def _check_target_scaling(config: Config) -> None:
    scaler = config.scaler
    given = [name for name in ("target_mean", "target_scale")
             if getattr(scaler, name) is not None]
    if not scaler.targets:
        if given:
            raise ConfigError(f"setting scaler.{given[0]} needs scaler.targets = true")
        return
    if scaler.mode == "none":
        raise ConfigError("setting scaler.targets = true needs scaler.mode = \"warmup\" "
                          "(statistics measured on the first labels) or \"fixed\" (with "
                          "scaler.target_mean and scaler.target_scale)")
    if config.model.type not in REGRESSOR_TYPES:
        raise ConfigError(f"setting scaler.targets = true standardizes a regressor's targets; "
                          f"model.type {config.model.type!r} is a classifier (its labels are "
                          "classes)")
    if (scaler.mode == "fixed" or given) and len(given) < 2:
        raise ConfigError("setting scaler.targets = true " + (
            "with scaler.mode = \"fixed\" needs" if not given else "needs both") +
            " scaler.target_mean and scaler.target_scale (e.g. the targets' mean and "
            "standard deviation" + (")" if scaler.mode == "fixed" else
                                   "; without them a warm-up measures them)"))


def _check_scope(config: Config) -> None:
    """The settings of a daemon with one model per partition or key (a member of a consumer
    group whose models live on the state topic)."""
    kafka, model = config.kafka, config.model
    if model.scope == "global":
        if (config.sources["model.max_models"] != "default"
                and model.max_models != SCHEMA["model"]["max_models"].default):
            raise ConfigError("setting model.max_models needs model.scope = \"partition\" or "
                              "\"key\" (a global model is one model)")
        return
    scoped = f"model.scope = \"{model.scope}\""
    if config.daemon.role != "learner":
        raise ConfigError(f"setting daemon.role = \"{config.daemon.role}\" serves one global "
                          f"model; {scoped} needs daemon.role = \"learner\"")
    if kafka.publish_state:
        raise ConfigError(
            f"setting kafka.publish_state = true publishes a global model for predictors; with "
            f"{scoped} every model's state is on kafka.state_topic anyway: remove the setting")
    if kafka.on_partition_reset != "stop":
        raise ConfigError(
            f"setting kafka.on_partition_reset = {kafka.on_partition_reset!r} needs model.scope "
            f"= \"global\": with {scoped} a partition that lost its offsets stops the daemon "
            "(the models of that partition would need resetting one by one)")
    if config.sources["kafka.state_topic"] == "default":
        problem = topic_name_problem(kafka.state_topic)
        if problem:
            raise ConfigError(
                f"setting kafka.state_topic (default \"<kafka.group_id>.state\" = "
                f"{kafka.state_topic!r}) {problem}: set kafka.state_topic")
    if kafka.heartbeat_interval_ms >= kafka.session_timeout_ms:
        raise ConfigError("setting kafka.heartbeat_interval_ms must be below "
                          "kafka.session_timeout_ms")
    if kafka.request_timeout_ms <= kafka.session_timeout_ms:
        raise ConfigError("setting kafka.request_timeout_ms must be above "
                          "kafka.session_timeout_ms (a group join waits up to the session "
                          "timeout)")


def _check_role(config: Config) -> None:
    """The settings of a learner that publishes its state and of a predictor that reads it."""
    kafka, role = config.kafka, config.daemon.role
    derived = config.sources["kafka.state_topic"] == "default"
    if role == "predictor":
        if derived:
            # Its default would come from the predictor's own group_id, which must differ from
            # the learner's (each reads the whole input topic in its own group): it would name
            # a topic no learner writes to.
            raise ConfigError(
                "setting daemon.role = \"predictor\" needs kafka.state_topic set explicitly to "
                "the topic its learner publishes to (the learner's default is "
                "\"<learner's group_id>.state\"; the predictor's own group_id must differ)"
            )
        if kafka.state_topic == f"{kafka.group_id}.state":
            # The learner's default topic name under the predictor's own group_id: the two
            # share a group, so the predictor would take the learner's partitions and offsets.
            raise ConfigError(
                f"setting kafka.group_id = {kafka.group_id!r} is the group whose default state "
                f"topic is kafka.state_topic = {kafka.state_topic!r}, i.e. the learner's: give "
                "the predictor a group_id of its own"
            )
        if kafka.publish_state:
            raise ConfigError(
                "setting kafka.publish_state = true applies to daemon.role = \"learner\": a "
                "predictor never changes the model, it reads the learner's state"
            )
        if not kafka.bootstrap_servers:
            raise ConfigError(
                "setting daemon.role = \"predictor\" needs kafka.bootstrap_servers: it reads "
                "its learner's state from that broker (an embedded broker holds none)"
            )
        # A predictor keeps neither: said, not refused, since a learner's configuration file
        # serves its predictors too (the README's replicas read the same file). Given by a
        # flag or the environment, for this process alone, they are a mistake worth a warning;
        # read from a file, most likely the learner's, a line of information.
        unused = [f"{section}.{key}" for section in ("checkpoint", "cache")
                  for key, setting in SCHEMA[section].items()
                  if config.sources[f"{section}.{key}"] != "default"
                  and getattr(getattr(config, section), key) != setting.default]
        for given_here in (True, False):
            names = [name for name in unused if _given_here(config.sources[name]) == given_here]
            if names:
                log.log(logging.WARNING if given_here else logging.INFO,
                        "settings %s %sare not used by a predictor (it learns nothing, caches "
                        "no unlabelled message and writes no checkpoint)", ", ".join(names),
                        "" if given_here else "of the configuration file ")
    else:
        for key, setting in SCHEMA["predictor"].items():
            name = f"predictor.{key}"
            if (config.sources[name] != "default"
                    and getattr(config.predictor, key) != setting.default):
                raise ConfigError(f"setting {name} needs daemon.role = \"predictor\"")
    if (role == "learner" and not kafka.publish_state and config.model.scope == "global"
            and not derived and kafka.state_topic != f"{kafka.group_id}.state"):
        # Said, not refused: a file shared with predictors names it, and publish_state may be
        # turned on later. (Its derived default, written out with a whole configuration, is
        # no setting.)
        log.warning("setting kafka.state_topic = %r is not written: a learner publishes its "
                    "state only with kafka.publish_state = true", kafka.state_topic)
    if derived and (kafka.publish_state or role == "predictor"):
        problem = topic_name_problem(kafka.state_topic)
        if problem:
            raise ConfigError(
                f"setting kafka.state_topic (default \"<kafka.group_id>.state\" = "
                f"{kafka.state_topic!r}) {problem}: set kafka.state_topic"
            )


def tls_context(config: Config) -> Any:
    """The TLS context kafka-python builds from the ``kafka.ssl_*`` settings (TLS 1.2 or newer,
    the host name checked, the certificate authorities of ``kafka.ssl_cafile`` or the
    system's), or None when ``kafka.security_protocol`` uses no TLS. ConfigError naming the
    setting when a file holds no usable certificate or key: the client logged it at every
    connection attempt and retried for ever, the daemon saying only that the broker was
    unreachable."""
    import ssl

    kafka = config.kafka
    if kafka.security_protocol not in ("SSL", "SASL_SSL"):
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = True
    if kafka.ssl_cafile:
        try:
            context.load_verify_locations(kafka.ssl_cafile)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ConfigError(f"setting kafka.ssl_cafile: {kafka.ssl_cafile!r} holds no "
                              f"certificate that can be read ({exc})") from None
    else:
        context.load_default_certs()
    if kafka.ssl_certfile:
        try:
            context.load_cert_chain(kafka.ssl_certfile, kafka.ssl_keyfile or None)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ConfigError(
                f"settings kafka.ssl_certfile ({kafka.ssl_certfile!r}) and kafka.ssl_keyfile "
                f"({kafka.ssl_keyfile!r}): no certificate and matching private key can be read "
                f"({exc})") from None
    return context


def kafka_client_settings(
    config: Config, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The kafka-python keyword arguments shared by the consumer, producer and admin client
    (bootstrap servers, TLS, SASL with credentials from the environment)."""
    environ = os.environ if environ is None else environ
    kafka = config.kafka
    settings: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap_servers.split(","),
        "client_id": kafka.client_id,
        "security_protocol": kafka.security_protocol,
        "request_timeout_ms": kafka.request_timeout_ms,
    }
    for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        path = getattr(kafka, key)
        if path:
            # Checked here: the client only logged "No such file or directory" at every
            # connection attempt, for ever, without naming the file or the setting.
            if not os.path.isfile(path) or not os.access(path, os.R_OK):
                raise ConfigError(f"setting kafka.{key}: {path!r} is not a readable file")
            settings[key] = path
    tls_context(config)  # (refuses a file the client could not use)
    if kafka.sasl_mechanism:
        username = environ.get(SASL_USERNAME_ENV)
        password = environ.get(SASL_PASSWORD_ENV)
        if not username or not password:
            raise ConfigError(
                f"setting kafka.sasl_mechanism={kafka.sasl_mechanism} needs the credentials in "
                f"the environment variables {SASL_USERNAME_ENV} and {SASL_PASSWORD_ENV}"
            )
        settings.update(
            sasl_mechanism=kafka.sasl_mechanism,
            sasl_plain_username=username,
            sasl_plain_password=password,
        )
    elif environ.get(SASL_USERNAME_ENV) or environ.get(SASL_PASSWORD_ENV):
        # Credentials meant for a SASL cluster would otherwise be dropped without a word.
        log.warning("%s / %s are set but not used: kafka.sasl_mechanism is not set (and "
                    "kafka.security_protocol is %s)", SASL_USERNAME_ENV, SASL_PASSWORD_ENV,
                    kafka.security_protocol)
    return settings
