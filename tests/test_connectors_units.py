"""Unit tests of the connector pieces that need no broker: configuration, message parsing,
dead letters, checkpoint files, metrics, the processor's cache and the CLI parser."""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import socket
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from connectors.checkpoint import CheckpointError, CheckpointStore
from connectors.cli import build_parser, main
from connectors.config import (
    MODEL_TYPES,
    SCHEMA,
    ConfigError,
    kafka_client_settings,
    load_config,
)
from connectors.messages import (
    Forget,
    Label,
    Malformed,
    Observe,
    Relabel,
    Source,
    Targets,
    dead_letter,
    encode,
    parse_label,
    parse_message,
)
from connectors.metrics import Metrics
from connectors.models import applicable_settings
from connectors.processor import Processor, Record

# -- configuration ---------------------------------------------------------------------------


try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

def test_precedence_file_then_flags_then_environment(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[model]\nC = 3.0\ngamma = 0.25\n[kafka]\ninput_topic = "from-file"\n')
    environ = {"STREAM_SVM_MODEL_C": "7", "STREAM_SVM_VENV": "x"}  # the latter is no setting
    config = load_config(path, {"model.C": "5"}, environ)
    assert config.model.C == 7.0 and config.model.gamma == 0.25
    assert config.kafka.input_topic == "from-file"
    assert config.sources["model.C"] == "env STREAM_SVM_MODEL_C"
    assert config.sources["model.gamma"] == str(path)


def test_an_environment_variable_overriding_a_flag_says_so(caplog):
    with caplog.at_level("WARNING", logger="stream_svm.config"):
        assert load_config(None, {"model.C": "5"}, {"STREAM_SVM_MODEL_C": "7"}).model.C == 7.0
    assert "STREAM_SVM_MODEL_C overrides the flag's value '5'" in caplog.text


def test_a_quoted_number_in_the_file_is_refused(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[model]\nC = "5"\n')
    with pytest.raises(ConfigError, match=r"model.C .*'5' is a string; write the float without"):
        load_config(path, {}, {})
    # Flags and environment variables are text: converted.
    assert load_config(None, {"model.C": "5"}, {}).model.C == 5.0


def test_a_comma_separated_list_of_numbers_must_say_what_it_means():
    with pytest.raises(ConfigError, match=r"'0,1' is ambiguous: write it as JSON, \[0, 1\] for "
                                          r'those numbers or booleans, or \["0", "1"\] for '
                                          r"strings"):
        load_config(None, {}, {"STREAM_SVM_MODEL_CLASSES": "0,1"})
    assert load_config(None, {}, {"STREAM_SVM_MODEL_CLASSES": "[0, 1]"}).model.classes == [0, 1]
    assert load_config(None, {}, {"STREAM_SVM_MODEL_CLASSES": '["0", "1"]'}).model.classes == [
        "0", "1"]
    assert load_config(None, {}, {"STREAM_SVM_MODEL_CLASSES": "ham, spam"}).model.classes == [
        "ham", "spam"]


def test_a_flag_or_a_variable_written_as_a_toml_string_is_the_string_it_holds():
    # --set 'kafka.group_id="g4"' joined the consumer group '"g4"', quotes included, and
    # --set 'scaler.mode="fixed"' was refused as not one of none, warmup, fixed.
    config = load_config(None, {"kafka.group_id": '"g4"', "model.kernel": "'linear'",
                                "model.C": ' "2.5" ', "checkpoint.dir": 'dir"1'},
                         {"STREAM_SVM_KAFKA_OUTPUT_TOPIC": '"out"'})
    assert (config.kafka.group_id, config.model.kernel, config.model.C) == ("g4", "linear", 2.5)
    assert (config.checkpoint.dir, config.kafka.output_topic) == (os.path.abspath('dir"1'),
                                                                  "out")
    assert load_config(None, {"kafka.label_topic": '""'}, {}).kafka.label_topic is None
    for classes in ('"ham","spam"', "'ham', 'spam'", 'ham, "spam"'):  # (kept their quotes)
        assert load_config(None, {"model.classes": classes}, {}).model.classes == ["ham",
                                                                                   "spam"]
    with pytest.raises(ConfigError, match=r"scaler.mode.*fixed"):  # (read as fixed: not refused
        load_config(None, {"scaler.mode": '"fixed"'}, {})             # as a mode, but lacks scales)


def test_paths_are_read_as_a_shell_would_give_them(monkeypatch, tmp_path):
    """A "~" in a path from a file or a variable reaches no shell: checkpoint.dir = "~/ck"
    made a directory named "~" under the working directory. A relative directory is named by
    its absolute path, which the messages about it then show."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    config = load_config(None, {"checkpoint.dir": "~/ck", "kafka.ssl_cafile": "~/ca.pem"}, {})
    assert config.checkpoint.dir == str(tmp_path / "ck")
    assert config.kafka.ssl_cafile == str(tmp_path / "ca.pem")
    assert load_config(None, {"checkpoint.dir": "a/b"}, {}).checkpoint.dir == str(
        tmp_path / "a" / "b")


def test_checkpoints_an_earlier_version_kept_under_a_literal_tilde_are_named(monkeypatch,
                                                                           tmp_path):
    """Versions that took "~/ck" literally kept their checkpoints in ./~/ck: read as the home
    directory's ck, which holds none, the start would be refused, and --start-fresh would
    have started a new model beside them."""
    home, work = tmp_path / "home", tmp_path / "work"
    (work / "~" / "ck").mkdir(parents=True)
    (work / "~" / "ck" / "checkpoint-000000000003.npz").write_bytes(b"saved")
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    with pytest.raises(ConfigError, match=(
            rf"setting checkpoint.dir '~/ck' is the directory {home / 'ck'} .* holds no "
            rf"checkpoint, but {work / '~' / 'ck'} .* holds checkpoints: move them")):
        load_config(None, {"checkpoint.dir": "~/ck"}, {})
    (home / "ck").mkdir()
    (home / "ck" / "checkpoint-000000000004.npz").write_bytes(b"moved")
    assert load_config(None, {"checkpoint.dir": "~/ck"}, {}).checkpoint.dir == str(home / "ck")


def test_a_batch_must_be_allowed_to_inflate_to_one_message_at_its_largest():
    assert load_config(None, {}, {}).kafka.max_inflated_batch_bytes == 256 * 1024 * 1024
    with pytest.raises(ConfigError, match=(
            r"kafka.max_inflated_batch_bytes \(4000, flag\) must be at least "
            r"kafka.max_message_bytes \(5000, flag\)")):
        load_config(None, {"kafka.max_message_bytes": 5000,
                           "kafka.max_inflated_batch_bytes": 4000}, {})
    assert load_config(None, {"kafka.max_message_bytes": 5000,
                              "kafka.max_inflated_batch_bytes": 5000}, {})


def test_a_setting_in_the_wrong_section_is_named_with_its_section(tmp_path):
    (tmp_path / "top.toml").write_text('bootstrap_servers = "h:9092"\n')
    with pytest.raises(ConfigError, match=r"top-level key 'bootstrap_servers' must be a "
                       r"\[section\]; bootstrap_servers is a setting of \[kafka\]"):
        load_config(tmp_path / "top.toml", environ={})
    (tmp_path / "model.toml").write_text('[model]\nbootstrap_servers = "h:9092"\n')
    with pytest.raises(ConfigError, match=r"unknown setting 'model.bootstrap_servers'; did you "
                       r"mean 'kafka.bootstrap_servers'\?"):
        load_config(tmp_path / "model.toml", environ={})
    with pytest.raises(ConfigError, match=r"unknown setting model.group_id; did you mean "
                       r"STREAM_SVM_KAFKA_GROUP_ID\?"):
        load_config(None, {}, {"STREAM_SVM_MODEL_GROUP_ID": "g"})
    # A key of another section wins over a look-alike of this one's (checkpoint.keep).
    with pytest.raises(ConfigError, match=r"did you mean 'model.kernel'\?"):
        load_config(None, {"checkpoint.kernel": "rbf"}, {})


def test_a_misspelt_setting_in_the_environment_is_named_with_the_variable_meant():
    with pytest.raises(ConfigError, match=r"STREAM_SVM_MODEL_GAMA: unknown setting model.gama; "
                                          r"did you mean STREAM_SVM_MODEL_GAMMA\?"):
        load_config(None, {}, {"STREAM_SVM_MODEL_GAMA": "0.1"})
    with pytest.raises(ConfigError, match=r"unknown setting model.zzzq; the settings of "
                                          r"\[model\] are type, scope,"):
        load_config(None, {}, {"STREAM_SVM_MODEL_ZZZQ": "1"})


def test_a_misspelt_section_in_the_environment_is_refused_not_ignored():
    # STREAM_SVM_MODLE_C=5 left C at its default without a word.
    with pytest.raises(ConfigError, match=r"STREAM_SVM_MODLE_C: unknown section 'modle'; did "
                                          r"you mean STREAM_SVM_MODEL_C\?"):
        load_config(None, {}, {"STREAM_SVM_MODLE_C": "5"})
    with pytest.raises(ConfigError, match=r"did you mean STREAM_SVM_METRICS_PORT\?"):
        load_config(None, {}, {"STREAM_SVM_METRIC_PORT": "9000"})
    with pytest.raises(ConfigError, match=r"did you mean STREAM_SVM_KAFKA_BOOTSTRAP_SERVERS\?"):
        load_config(None, {}, {"STREAM_SVM_KAFA_BOOTSTRAP_SERVER": "k:9092"})
    # A setting's name without its section was ignored.
    with pytest.raises(ConfigError, match=r"STREAM_SVM_GAMMA names no section: did you mean "
                                          r"STREAM_SVM_MODEL_GAMMA\?"):
        load_config(None, {}, {"STREAM_SVM_GAMMA": "0.5"})
    with pytest.raises(ConfigError, match=r"did you mean STREAM_SVM_KAFKA_INPUT_TOPIC\?"):
        load_config(None, {}, {"STREAM_SVM_INPUT_TOPIC": "t"})
    # Variables that name no setting are someone else's.
    load_config(None, {}, {"STREAM_SVM_VENV": "x", "STREAM_SVM_ADVERSARIAL_SCENARIOS": "9",
                           "STREAM_SVM_SPEED": "fast", "STREAM_SVM_SCALE": "2"})


def test_kubernetes_service_links_are_not_taken_for_settings():
    # A Service named stream-svm (or stream-svm-metrics) in the namespace gives every pod
    # STREAM_SVM_PORT=tcp://..., STREAM_SVM_METRICS_SERVICE_HOST, ...: the start was refused
    # ("names no section", "unknown setting metrics.service_host"), or metrics.port read
    # "tcp://10.0.0.8:9464".
    links = {}
    for service, address in (("STREAM_SVM", "10.0.0.7"), ("STREAM_SVM_METRICS", "10.0.0.8")):
        links.update({
            f"{service}_PORT": f"tcp://{address}:9464",
            f"{service}_PORT_9464_TCP": f"tcp://{address}:9464",
            f"{service}_PORT_9464_TCP_PROTO": "TCP",
            f"{service}_PORT_9464_TCP_PORT": "9464",
            f"{service}_PORT_9464_TCP_ADDR": address,
            f"{service}_SERVICE_HOST": address,
            f"{service}_SERVICE_PORT": "9464",
            f"{service}_SERVICE_PORT_METRICS": "9464",
        })
    config = load_config(None, {}, links)
    assert config.metrics.port == SCHEMA["metrics"]["port"].default
    assert config.sources["metrics.port"] == "default"
    # The setting itself is still read.
    assert load_config(None, {}, {**links, "STREAM_SVM_METRICS_PORT": "9999"}).metrics.port == 9999


@pytest.mark.parametrize("servers", ["127.0.0.1:port", "a b:9092", "h:0", "h:99999", "[::1",
                                     ",", "fe80::1%eth0", "a\x00b:9092"])
def test_bootstrap_servers_that_are_not_host_port_are_refused_at_start(servers):
    with pytest.raises(ConfigError,
                       match=r"kafka.bootstrap_servers \(from flag\): must (be|name at "
                             r"least one) host:port"):
        load_config(None, {"kafka.bootstrap_servers": servers}, {})


def test_bootstrap_servers_separated_otherwise_than_by_commas_are_named_so():
    # "a:1;b:2" was refused as "not an IPv6 address".
    for servers in ("a:1;b:2", "a:1 b:2"):
        with pytest.raises(ConfigError, match=r"separated by commas: .* holds several"):
            load_config(None, {"kafka.bootstrap_servers": servers}, {})


def test_bootstrap_servers_in_every_form_kafka_clients_take():
    for servers in ("kafka:9092", "kafka", "[::1]:9092", "::1", "SASL_SSL://b1:9093,b2:9093",
                    "b_1:9092,", "a:1,,b:2"):
        assert load_config(None, {"kafka.bootstrap_servers": servers}, {}).kafka \
            .bootstrap_servers == servers


@pytest.mark.parametrize(
    ("overrides", "environ", "named"),
    [
        ({"model.C": "-1"}, {}, "model.C"),
        ({"model.C": "abc"}, {}, "model.C"),
        ({"model.kernel": "cubic"}, {}, "model.kernel"),
        ({"model.bogus": "1"}, {}, "model.bogus"),
        ({}, {"STREAM_SVM_KAFKA_NOPE": "1"}, "kafka.nope"),
        # (read by nothing: ignored without a word)
        ({}, {"STREAM_SVM_CONFIG": "my.toml"}, "STREAM_SVM_CONFIG is no setting: give --config"),
        ({}, {"STREAM_SVM_LOG_LEVEL": "DEBUG"}, "give --log-level"),
        ({"metrics.port": "70000"}, {}, "metrics.port"),
        ({"kafka.output_topic": "stream-svm.input"}, {}, "kafka.output_topic"),
        ({"kafka.input_topic": "bad topic!"}, {}, "kafka.input_topic"),
        ({"kafka.sasl_mechanism": "PLAIN"}, {}, "kafka.sasl_mechanism"),
        # (the client failed at every attempt, retried for ever as an unreachable broker)
        ({"kafka.security_protocol": "SASL_PLAINTEXT"}, {}, "needs kafka.sasl_mechanism"),
        ({"kafka.security_protocol": "SASL_SSL"}, {}, "needs kafka.sasl_mechanism"),
        ({"metrics.enabled": "maybe"}, {}, "metrics.enabled"),
        ({"kafka.fetch_max_wait_ms": "0"}, {}, "kafka.fetch_max_wait_ms"),
        ({"kafka.fetch_max_wait_ms": "30000"}, {}, "kafka.fetch_max_wait_ms"),
        ({"kafka.request_timeout_ms": "40", "kafka.fetch_max_wait_ms": "50"}, {},
         "50, flag"),  # both values, both sources
        ({"kafka.request_timeout_ms": "600000"}, {}, "kafka.request_timeout_ms"),
        # Each of these was accepted, then broke the daemon: every learn dead-lettered
        # (max_breakpoints past a C integer), a crash at the first fetch or at topic creation
        # (32-bit fields of Kafka's protocol), a reconnect loop for ever (client_id), a
        # predictor that stopped refreshing or a retry that crashed (waits past what Python's
        # threads take), a stop that waited for a poll of hours, an LS-SVM of 7 GB.
        ({"model.max_breakpoints": str(2**63)}, {}, "model.max_breakpoints"),
        ({"kafka.max_message_bytes": "3000000000"}, {}, "kafka.max_message_bytes"),
        ({"kafka.max_message_bytes": "10"}, {}, "must be at least 512 bytes"),
        ({"kafka.topic_partitions": str(2**31)}, {}, "kafka.topic_partitions"),
        ({"kafka.client_id": "c" * 32768}, {}, "kafka.client_id"),
        ({"kafka.max_batch": str(2**64)}, {}, "kafka.max_batch"),
        ({"kafka.poll_timeout_ms": "30000"}, {}, "kafka.poll_timeout_ms"),
        ({"retry.max_backoff_seconds": "1e308"}, {}, "retry.max_backoff_seconds"),
        ({"retry.initial_backoff_seconds": "1e10", "retry.max_backoff_seconds": "1e10"}, {},
         "retry.initial_backoff_seconds"),
        ({"checkpoint.every_seconds": "1e300"}, {}, "checkpoint.every_seconds"),
        ({"daemon.role": "predictor", "kafka.state_topic": "s.state", "kafka.group_id": "p",
          "kafka.bootstrap_servers": "h:9092", "predictor.refresh_seconds": "1e308"}, {},
         "predictor.refresh_seconds"),
        ({"kafka.linger_ms": "95000"}, {}, "plus kafka.request_timeout_ms"),
        ({"model.type": "IncrementalLSSVC", "model.features": "rff",
          "model.n_components": "100000000"}, {}, "model.n_components"),
        ({}, {"STREAM_SVM_MODEL_C": "1_0"}, "model.C"),
        # scikit-learn's gamma = "scale" is what its users try first: told what to give instead.
        ({"model.gamma": "scale"}, {}, "is not a valid float [(]a model that learns online "
                                       "keeps one kernel for every point it stores, so gamma is "
                                       "a number it cannot rescale later, not 'scale' or 'auto'"),
        ({}, {"STREAM_SVM_MODEL_DEGREE": "\u0663"}, "model.degree"),
    ],
)
def test_invalid_settings_fail_naming_the_setting(overrides, environ, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(None, overrides, environ)


def test_settings_a_daemon_does_not_use_are_named_in_a_warning(caplog, tmp_path):
    # Accepted without a word before: a predictor keeps no checkpoint and no cache, and a
    # learner that does not publish writes no state topic. Not refused: a learner's file
    # serves its predictors too, and publishing may be turned on later.
    predictor = {"daemon.role": "predictor", "kafka.state_topic": "s.state",
                 "kafka.group_id": "p", "kafka.bootstrap_servers": "h:9092"}
    caplog.set_level(logging.INFO, logger="stream_svm.config")
    load_config(None, {**predictor, "checkpoint.every_messages": "1", "cache.max_size": "5"},
                {})
    assert [record.levelname for record in caplog.records] == ["WARNING"]
    assert caplog.records[0].getMessage().startswith(
        "settings checkpoint.every_messages, cache.max_size are not used by a predictor")
    # Read from the learner's file, as the README's replicas do: information, not a warning
    # that following the README would raise at every start.
    caplog.clear()
    learner = tmp_path / "learner.toml"
    learner.write_text("[checkpoint]\ndir = \"cp\"\nevery_messages = 7\n")
    load_config(learner, {**predictor, "cache.max_size": "5"}, {})
    assert [record.levelname for record in caplog.records] == ["WARNING", "INFO"]
    assert caplog.records[0].getMessage().startswith(
        "settings cache.max_size are not used by a predictor")
    assert caplog.records[1].getMessage().startswith(
        "settings checkpoint.dir, checkpoint.every_messages of the configuration file are not "
        "used by a predictor")
    caplog.clear()
    load_config(None, {"kafka.state_topic": "s.state"}, {})
    assert "setting kafka.state_topic = 's.state' is not written" in caplog.text
    caplog.clear()
    load_config(None, {"kafka.state_topic": "stream-svm.state"}, {})  # the derived default
    assert not caplog.text


def test_a_config_file_with_a_byte_order_mark_or_no_end_is_read_or_named(tmp_path):
    # The mark was "Invalid statement (at line 1, column 1)"; /dev/zero ran out of memory.
    marked = tmp_path / "marked.toml"
    marked.write_bytes(b"\xef\xbb\xbf[model]\nC = 2.0\n")
    assert load_config(marked, {}, {}).model.C == 2.0
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"#" * (2 << 20))
    with pytest.raises(ConfigError, match="is larger than 1048576 bytes"):
        load_config(huge, {}, {})


def test_an_unknown_setting_is_answered_with_the_nearest_ones():
    with pytest.raises(ConfigError, match=r"'model\.gama'; did you mean 'model\.gamma'\?$"):
        load_config(None, {"model.gama": "1"}, {})
    with pytest.raises(ConfigError, match=r"did you mean 'kafka\.bootstrap_servers'\?"):
        load_config(None, {"kafka.bootstrap_server": "x:1"}, {})
    # Nothing close: the section's settings, or the sections.
    with pytest.raises(ConfigError, match=r"the settings of \[model\] are type, scope, "):
        load_config(None, {"model.zzz": "1"}, {})
    with pytest.raises(ConfigError, match=r"the sections are kafka, daemon, "):
        load_config(None, {"nope.x": "1"}, {})


def test_tables_and_lists_on_the_command_line_take_json_or_the_files_toml():
    # --set 'scaler.means={ "1" = 0.0 }', as the settings reference writes it, was refused as
    # "not a JSON object".
    toml = load_config(None, {"scaler.mode": "fixed", "scaler.means": '{ "1" = 0.5, b = 2 }',
                              "model.classes": "['ham', 'spam']"},
                       {"STREAM_SVM_SCALER_SCALES": '{ "1" = 4.0 }'})
    json_text = load_config(None, {"scaler.mode": "fixed", "scaler.means": '{"1": 0.5, "b": 2}',
                                   "model.classes": '["ham", "spam"]'},
                            {"STREAM_SVM_SCALER_SCALES": '{"1": 4.0}'})
    for config in (toml, json_text):
        assert config.scaler.means == {"1": 0.5, "b": 2.0}
        assert config.scaler.scales == {"1": 4.0}
        assert config.model.classes == ["ham", "spam"]
    with pytest.raises(ConfigError, match=r"setting scaler\.means \(from flag\): '\{1: 0\}' is "
                                          r"neither a JSON object .* nor a TOML inline table"):
        load_config(None, {"scaler.mode": "fixed", "scaler.means": "{1: 0}"}, {})


def test_an_empty_value_unsets_an_optional_setting_of_the_file(tmp_path):
    # A file's classes, reserve_epsilon or max_features can be taken back from the command line or
    # the environment without editing the file; a setting that must have a value refuses it.
    config = tmp_path / "spam.toml"
    config.write_text('[model]\nclasses = ["ham", "spam"]\nreserve_epsilon = 0.1\n'
                      'max_features = 500\n')
    unset = load_config(config, {"model.classes": "", "model.reserve_epsilon": ""},
                        {"STREAM_SVM_MODEL_MAX_FEATURES": ""})
    assert (unset.model.classes, unset.model.reserve_epsilon, unset.model.max_features) == (
        None, None, None)
    kept = load_config(config, {}, {})
    assert (kept.model.classes, kept.model.reserve_epsilon, kept.model.max_features) == (
        ["ham", "spam"], 0.1, 500)
    with pytest.raises(ConfigError, match=r"setting model\.C \(from flag\): '' is not a valid"):
        load_config(config, {"model.C": ""}, {})


def test_bundled_configs_are_valid():
    from pathlib import Path

    configs = Path(__file__).resolve().parents[1] / "configs"
    river = load_config(configs / "river_flow.toml", environ={})
    assert (river.model.type, river.model.window_size, river.model.step) == (
        "SlidingWindowSVC", 1423, 30)
    reference = Path(__file__).resolve().parents[1] / "connectors" / "default.toml"
    default = load_config(reference, environ={})
    assert default.as_dict() == load_config(None, environ={}).as_dict()  # documents every default
    written = {name for name, source in default.sources.items() if source != "default"}
    # Every setting is documented: set, or (a model setting of another type, or one without a
    # default value) as a commented-out line in its section.
    text = reference.read_text()
    commented = {f"{section}.{key}" for section in SCHEMA for key in SCHEMA[section]
                 if f"\n# {key} = " in text}
    assert written | commented == {f"{s}.{k}" for s, keys in SCHEMA.items() for k in keys}
    # Each commented value is valid for a type it applies to, and is the default when there
    # is one.
    load_config(None, {"scaler.mode": "fixed", **{
        f"scaler.{key}": json.dumps(tomllib.loads(text.split(f"\n# {key} = ")[1].split("\n")[0]
                                                  .join(["v = ", ""]))["v"])
        for key in ("means", "scales")}}, environ={})
    for name in sorted(n for n in commented if n.startswith("model.")):
        key = name.split(".")[1]
        model_type = next(t for t in MODEL_TYPES if key in applicable_settings(t))
        value = text.split(f"\n# {key} = ")[1].split("\n")[0]
        # (with the kernel or feature map the setting is a parameter of)
        chooser = {"degree": {"model.kernel": "poly"}, "coef0": {"model.kernel": "poly"},
                   "n_components": {"model.features": "rff"},
                   "seed": {"model.features": "rff"}}.get(key, {})
        example = load_config(None, {"model.type": model_type, **chooser,
                                     name: value.strip('"')}, environ={})
        if SCHEMA["model"][key].default is not None and key != "classes":
            assert getattr(example.model, key) == SCHEMA["model"][key].default, name
    for path in sorted(configs.glob("*.toml")):
        load_config(path, environ={})


@pytest.mark.parametrize(("overrides", "wait"), [
    ({}, 50),
    ({"kafka.poll_timeout_ms": "10"}, 10),  # a short poll, set to cut latency, keeps doing so
    ({"kafka.poll_timeout_ms": "0"}, 1),  # never 0: an idle consumer would spin
    ({"kafka.poll_timeout_ms": "10", "kafka.fetch_max_wait_ms": "80"}, 80),
    ({"kafka.request_timeout_ms": "40"}, 39),  # kept below the request timeout
])
def test_the_fetch_wait_defaults_to_50_ms_or_a_shorter_poll_timeout(overrides, wait):
    assert load_config(None, overrides, environ={}).kafka.fetch_max_wait_ms == wait


def test_kafka_settings_pass_through_with_credentials_from_the_environment(tmp_path):
    ca = Path(__file__).parent / "data" / "tls" / "ca.pem"
    config = load_config(
        None,
        {"kafka.bootstrap_servers": "a:1,b:2", "kafka.security_protocol": "SASL_SSL",
         "kafka.sasl_mechanism": "SCRAM-SHA-256", "kafka.ssl_cafile": str(ca)},
        {},
    )
    with pytest.raises(ConfigError, match="STREAM_SVM_SASL_USERNAME"):
        kafka_client_settings(config, {})
    settings = kafka_client_settings(
        config, {"STREAM_SVM_SASL_USERNAME": "u", "STREAM_SVM_SASL_PASSWORD": "p"}
    )
    assert settings["bootstrap_servers"] == ["a:1", "b:2"]
    assert settings["sasl_plain_username"] == "u" and settings["ssl_cafile"] == str(ca)


# -- messages --------------------------------------------------------------------------------


def test_parse_every_kind():
    assert parse_message(b'{"id": "a", "x": {"f": 1, "h": 2.5}, "y": 0}', 100) == (
        Observe("a", {"f": 1.0, "h": 2.5}, False))
    assert parse_message(b'{"id": 2, "x": {}}', 100) == Observe(2, {}, None)
    assert parse_message(b'{"id": 2, "y": -1}', 100) == Label(2, False)
    assert parse_message(b'{"op": "forget", "id": 2}', 100) == Forget(2)
    assert parse_message(b'{"op": "relabel", "id": 2, "y": 1}', 100) == Relabel(2, True)
    assert parse_label(b'{"id": "k", "y": true}', 100) == Label("k", True)


@pytest.mark.parametrize(
    "raw",
    [
        None, b"", b"\xff", b"[1]", b'"s"', b"{", b'{"x": {}}', b'{"id": true, "x": {}}',
        b'{"id": 1.0, "x": {}}', b'{"id": "", "x": {}}', b'{"id": 1, "x": [1]}',
        b'{"id": 1, "x": {"a": NaN}}', b'{"id": 1, "x": {"a": -Infinity}}',
        b'{"id": 1, "x": {"a": 1e400}}', b'{"id": 1, "x": {"a": "1"}}',
        b'{"id": 1, "x": {"a": true}}', b'{"id": 1, "x": {"a": false}}',
        b'{"id": 1, "x": {"a": null}}',
        b'{"id": 1, "x": {"a": 1}, "y": 2}', b'{"id": 1, "x": {"a": 1}, "y": "true"}',
        b'{"id": 1, "x": {}, "z": 1}', b'{"op": "x", "id": 1}',
        b'{"op": "relabel", "id": 1}', b'{"id": 99999999999999999999, "x": {}}', b'{"id": 1}',
        b'{"id": 1, "x": {"a": ' + b"9" * 5000 + b"}}",
    ],
)
def test_malformed_messages_raise_malformed_only(raw):
    with pytest.raises(Malformed):
        parse_message(raw, 10_000)


@pytest.mark.parametrize("raw, error", [
    (b'{"id": 10, "x": {"a": 1}, "y": true, "y": false}', "field 'y' appears twice"),
    (b'{"id": 11, "x": {"a": "bad", "a": 1}}', "field 'a' appears twice"),
    (b'{"op": "forget", "id": 1, "id": 2}', "field 'id' appears twice"),
    ('\ufeff{"id": 12, "x": {}}'.encode(), "starts with a byte-order mark"),
])
def test_a_field_given_twice_or_a_byte_order_mark_is_named(raw, error):
    # The last of two values won silently ({"y": true, "y": false} learned as false); a BOM
    # gave "Expecting value: line 1 column 1".
    with pytest.raises(Malformed, match=error):
        parse_message(raw, 10_000)


def test_size_limit_and_dead_letter_records():
    raw = b'{"id": 1, "x": {"a": 1.0}}'
    with pytest.raises(Malformed, match="size limit"):
        parse_message(raw, len(raw) - 1)
    source = Source("t", 3, 42)
    text = dead_letter("why", raw, source, 1000)
    assert text == {"error": "why", "reason": "malformed", "raw": raw.decode(),
                    "raw_encoding": "utf-8",
                    "source": {"topic": "t", "partition": 3, "offset": 42}}
    assert dead_letter("why", raw, source, 1000, reason="internal")["reason"] == "internal"
    binary = dead_letter("why", b"\xff\x00", source, 1000)
    assert base64.b64decode(binary["raw"]) == b"\xff\x00" and binary["raw_encoding"] == "base64"
    cut = dead_letter("big", b"a" * 500, source, 300)
    assert len(encode(cut)) <= 300 and cut["truncated"] is True
    assert cut["raw_encoding"] == "utf-8" and 150 < len(cut["raw"]) and "a" * 500 > cut["raw"]
    json.dumps(dead_letter("none", None, source, 10))
    # Whatever the bytes, the encoded record fits the limit (a broker refuses larger ones):
    # JSON escapes a control character in 6 bytes, a character beyond ASCII in 6 or 12.
    for raw in (b"\x01" * 4000, "\u00e9\U0001F600".encode() * 700, b'{"a": "\\""}' * 900,
                b"\xff" * 5000):
        letter = dead_letter("why", raw, source, 3000)
        assert len(encode(letter)) <= 3000 and letter["truncated"] is True
        kept = (base64.b64decode(letter["raw"]) if letter["raw_encoding"] == "base64"
                else letter["raw"].encode("utf-8"))
        assert raw.startswith(kept) and len(kept) > 400  # as much as fits: 6 bytes a control
    whole = dead_letter("why", b"\x01" * 400, source, 3000)  # 2400 bytes escaped: it fits
    assert whole["raw"] == "\x01" * 400 and "truncated" not in whole


def test_an_output_over_the_producers_limit_goes_out_as_an_internal_dead_letter(caplog):
    # Such a record fails at every retry of the producer: the stream stalled behind it.
    from connectors.daemon import _oversized_as_dead_letters

    big = encode({"id": 7, "prediction": True, "source": {"topic": "in", "partition": 2,
                                                         "offset": 5}, "pad": "x" * 5000})
    small = encode({"id": 8})
    sent = _oversized_as_dead_letters([("out", b"7", big), ("out", b"8", small)], 3000, "dl")
    assert [(topic, key) for topic, key, _ in sent] == [("dl", b"7"), ("out", b"8")]
    letter = json.loads(sent[0][2])
    assert letter["reason"] == "internal" and letter["truncated"] is True
    assert letter["source"] == {"topic": "in", "partition": 2, "offset": 5}
    assert letter["error"].startswith(
        f"an output of {len(big)} bytes for topic out (about {len(big) + 1 + 1024} as a "
        "record, with its key and framing) was over the producer's limit of 3000 bytes")
    assert len(sent[0][2]) <= 1500 and big.decode().startswith(letter["raw"])
    assert "sent as an internal dead letter instead" in caplog.text


# -- checkpoints -----------------------------------------------------------------------------


def test_checkpoint_round_trip_keep_and_fallback(tmp_path, caplog):
    store = CheckpointStore(tmp_path, keep=2)
    for i in range(3):
        store.save({"w": np.arange(i + 1.0)}, {"i": i}, {"offsets": {"t:0": i}})
    assert [seq for seq, _ in store.paths()] == [3, 2]  # keep=2 pruned the first
    newest = store.paths()[0][1]
    newest.write_bytes(newest.read_bytes()[:-30])  # a torn / corrupt file
    loaded = store.load_latest()
    assert loaded.sequence == 2 and loaded.state["offsets"] == {"t:0": 1}
    assert "is unreadable" in caplog.text
    assert [p.name.split(".")[1] for p in tmp_path.glob("*.unusable-*")] == ["npz"]
    # A restore that fails (e.g. the model refuses the arrays) also falls back.
    store.save({"w": np.zeros(1)}, {"i": 9}, {})

    def refuse(checkpoint):
        if checkpoint.model_meta["i"] == 9:
            raise ValueError("bad arrays")
        return "ok"

    assert store.load_latest(refuse).restored == "ok"
    for _, path in store.paths():
        path.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        store.load_latest()
    assert not list(tmp_path.glob("*.tmp"))


def test_checkpoint_never_unpickles_and_refuses_objects(tmp_path):
    store = CheckpointStore(tmp_path)
    with pytest.raises(CheckpointError, match="dtype object"):
        store.save({"o": np.array([object()])}, {}, {})
    # A file holding a pickled array is refused when read, not unpickled.
    path = tmp_path / "checkpoint-000000000001.npz"
    np.savez(path, o=np.array([{"a": 1}], dtype=object), __meta__=np.frombuffer(b"{}", np.uint8))
    with pytest.raises(CheckpointError):
        store.read(path)


def test_a_named_pipe_called_like_a_checkpoint_is_set_aside_without_blocking(tmp_path):
    # Opening it waited for a writer: the daemon's start hung, and SIGTERM did not end it.
    import os
    import threading

    store = CheckpointStore(tmp_path)
    store.save({"w": np.ones(2)}, {"i": 1}, {})
    os.mkfifo(tmp_path / "checkpoint-000000000999.npz")
    result: list = []
    reader = threading.Thread(target=lambda: result.append(store.load_latest()), daemon=True)
    reader.start()
    reader.join(20)
    assert not reader.is_alive(), "reading a named pipe blocked"
    assert result[0].model_meta == {"i": 1}
    assert [p.name.split(".npz")[1][:9] for p in tmp_path.glob("*.unusable-*")] == [".unusable"]
    with pytest.raises(CheckpointError, match="not a regular file"):
        store.read(next(tmp_path.glob("*.unusable-*")).rename(tmp_path / "checkpoint-"
                                                               "000000001000.npz"))


def test_a_checkpoint_directory_that_cannot_be_created_is_named_as_the_setting():
    # "[Errno 2] No such file or directory: '/proc/nope'" named neither the setting nor why.
    from pathlib import Path

    from connectors.checkpoint import DirectoryLock

    if not Path("/proc/self").is_dir():
        pytest.skip("needs Linux's /proc, where no directory can be created")
    with pytest.raises(CheckpointError, match=r"cannot create the checkpoint directory "
                                              r"/proc/nope \(checkpoint.dir, --checkpoint-dir\)"):
        DirectoryLock(Path("/proc/nope")).acquire()


def test_a_full_disk_at_start_still_locks_the_checkpoint_directory(tmp_path, monkeypatch,
                                                                   caplog):
    # The pid written into the lock file failed, and closing the file failed again: the start
    # was refused with a bare "[Errno 28] No space left on device". The lock needs no data:
    # the daemon starts, and its checkpoints fail, logged, until the disk has room.
    import errno

    import connectors.checkpoint
    from connectors.checkpoint import DirectoryLock

    def full(descriptor, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(connectors.checkpoint.os, "write", full)
    lock = DirectoryLock(tmp_path / "checkpoints")
    lock.acquire()
    assert lock.held()
    assert "cannot write this daemon's pid into the lock file" in caplog.text
    with pytest.raises(CheckpointError, match="in use by another daemon: stop it, or give "):
        DirectoryLock(tmp_path / "checkpoints").acquire()  # (no pid written: none named)
    lock.release()
    monkeypatch.undo()
    again = DirectoryLock(tmp_path / "checkpoints")
    again.acquire()  # released: free again, and the pid written this time
    assert (tmp_path / "checkpoints" / ".lock").read_text() == str(os.getpid())
    with pytest.raises(CheckpointError, match=rf"in use by another daemon \(process "
                                              rf"{os.getpid()}, as its lock file says\)"):
        DirectoryLock(tmp_path / "checkpoints").acquire()
    again.release()


def test_a_checkpoint_directory_that_is_a_dangling_link_is_named_as_one(tmp_path):
    from connectors.checkpoint import DirectoryLock

    link = tmp_path / "ck"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(CheckpointError, match=rf"{link} .* is a symbolic link to "
                                              rf"{tmp_path / 'gone'}, which does not exist"):
        DirectoryLock(link).acquire()
    assert [path.name for path in tmp_path.iterdir()] == ["ck"]


def test_a_lock_released_before_any_checkpoint_removes_the_directories_it_made(tmp_path):
    """A start refused after it locked a new checkpoint directory ("Nothing was changed")
    left the directory and its lock file behind. Directories that hold anything more, or
    that were there before, stay."""
    from connectors.checkpoint import DirectoryLock

    made = tmp_path / "new" / "checkpoints"
    lock = DirectoryLock(made)
    lock.acquire()
    assert (made / ".lock").exists()
    lock.release()
    assert not (tmp_path / "new").exists()

    lock = DirectoryLock(made)
    lock.acquire()
    (made / "checkpoint-000000000001.npz").write_bytes(b"saved")
    lock.release()
    assert sorted(p.name for p in made.iterdir()) == [".lock", "checkpoint-000000000001.npz"]

    existing = tmp_path / "existing"
    existing.mkdir()
    lock = DirectoryLock(existing)
    lock.acquire()
    lock.release()
    assert [p.name for p in existing.iterdir()] == [".lock"]


def test_a_sequence_past_twelve_digits_stays_the_newest_checkpoint(tmp_path):
    # checkpoint-1000000000000.npz did not match the name pattern: every save overwrote it
    # unseen, and every restart went back to checkpoint-999999999999.npz.
    store = CheckpointStore(tmp_path, keep=2)
    store.save({"w": np.zeros(1)}, {"i": 0}, {})
    (tmp_path / "checkpoint-000000000001.npz").rename(tmp_path / "checkpoint-999999999999.npz")
    store.save({"w": np.ones(1)}, {"i": 1}, {})
    store.save({"w": np.ones(1)}, {"i": 2}, {})
    assert [seq for seq, _ in store.paths()] == [10**12 + 1, 10**12]
    assert store.load_latest().model_meta == {"i": 2}


def test_a_checkpoint_whose_model_contradicts_its_settings_is_not_restored(tmp_path, caplog):
    # The model was built from the parameters in its own metadata: with reserve_epsilon
    # edited there (the settings saying None), the daemon restarted silently and went on
    # discarding points, no longer exact.
    from connectors.daemon import Daemon
    from connectors.models import build_model, load_served_model

    config = load_config(None, {"checkpoint.dir": str(tmp_path / "ckpt"),
                                "metrics.enabled": False}, environ={})
    daemon = Daemon(config)
    daemon.processor = daemon._new_processor(build_model(config))
    daemon._store = CheckpointStore(config.checkpoint.dir)
    daemon.processor.process([Record(config.kafka.input_topic, 0, i, json.dumps(
        {"id": i, "x": {"a": float(i)}, "y": i % 2 == 0}).encode(), 0) for i in range(6)])
    daemon.checkpoint()
    path = daemon._store.paths()[0][1]
    checkpoint = daemon._store.read(path)
    checkpoint.model_meta["params"]["reserve_epsilon"] = 0.5
    daemon._store.save(checkpoint.arrays, checkpoint.model_meta, checkpoint.state,
                       checkpoint.cache_arrays)
    restored = Daemon(config)
    restored._store = CheckpointStore(config.checkpoint.dir)
    processor = restored._restore()
    assert processor.model.reserve_epsilon is None
    assert "reserve_epsilon=0.5, but the settings it was saved with say None" in caplog.text
    assert load_served_model(tmp_path / "ckpt").model.reserve_epsilon is None


# -- metrics, processor, CLI ------------------------------------------------------------------


def test_metrics_endpoint_serves_prometheus_names():
    metrics = Metrics()
    port = metrics.serve("127.0.0.1", 0)
    try:
        metrics.messages.labels(outcome="learned").inc(2)
        metrics.lag.labels(topic="t", partition="0").set(5)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        metrics.close()
    text = body.decode()
    assert 'stream_svm_messages_total{outcome="learned"} 2.0' in text
    for name in ("stream_svm_breakpoints_total", "stream_svm_update_seconds_bucket",
                 "stream_svm_predict_seconds_bucket", "stream_svm_update_breakpoints_bucket",
                 "stream_svm_seconds_since_checkpoint",
                 "stream_svm_margin_vectors", "stream_svm_stored_points",
                 'stream_svm_consumer_lag{partition="0",topic="t"} 5.0'):
        assert name in text
    with socket.socket() as probe:  # the server is closed
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_a_partition_with_messages_that_no_fetch_returns_is_reported_stalled(monkeypatch,
                                                                              caplog):
    # The embedded broker answered every fetch empty once a partition held many small
    # batches: the daemon stopped reading for good, and only the lag metric grew.
    from collections import namedtuple

    from prometheus_client import generate_latest

    import connectors.daemon as daemon_module
    from connectors.daemon import Daemon

    Partition = namedtuple("Partition", "topic partition")
    moving, stuck, idle, waiting = (Partition("in", p) for p in range(4))

    class Consumer:
        def __init__(self):
            self.positions = {moving: 10, stuck: 5, idle: 7, waiting: 3}
            self.ends = {moving: 50, stuck: 40, idle: 7, waiting: 9}

        def assignment(self):
            return set(self.positions)

        def paused(self):
            return {waiting}  # (a scoped partition waiting for its models' states)

        def highwater(self, tp):
            return self.ends[tp]

        def position(self, tp, timeout_ms=None):
            return self.positions[tp]

    caplog.set_level("INFO", logger="connectors.daemon")
    now = [100.0]
    monkeypatch.setattr(daemon_module.time, "monotonic", lambda: now[0])
    daemon = Daemon(load_config(None, {"metrics.enabled": False}, environ={}))
    daemon._consumer = consumer = Consumer()

    full = [object()] * daemon.config.kafka.max_batch

    def polls(count, returned, reading_again=False):
        for _ in range(count):
            if reading_again:  # (a scoped model the state topic did not give back)
                daemon._read_again_at["in:1"] = now[0]
            daemon._update_lag()
            consumer.positions[moving] += 5
            for _ in range(5):  # polls between two looks, each returning `returned` records
                daemon._note_poll(returned)
            now[0] += 15

    # Full polls (kafka-python may hand out one partition's backlog before the next's) and
    # records held back after a reconnect are no stall.
    polls(7, full)
    daemon._verify_until = math.inf
    polls(7, [])
    daemon._verify_until = 0.0
    # Records sought back to be read again come back every poll: the position stays, no stall.
    polls(7, full[:3], reading_again=True)
    assert "no fetch has returned" not in caplog.text
    # Polls that drain the fetched records, here with messages of the other partitions: every
    # fetch asked for the stuck one too. (Before, only polls that returned nothing at all
    # counted, and a stalled partition beside flowing ones was never reported.)
    polls(7, full[:3])
    stalled = [r.getMessage() for r in caplog.records if "no fetch has returned" in r.message]
    assert len(stalled) == 1 and stalled[0].startswith("partition in:1 has 35 messages to read")
    assert "raise kafka.fetch_max_wait_ms (50 ms now)" in stalled[0]
    assert "stream_svm_stalled_partitions 1.0" in generate_latest(
        daemon.metrics.registry).decode()
    consumer.positions[stuck] += 1  # it reads again
    daemon._update_lag()
    assert "partition in:1 is read again" in caplog.text
    assert "stream_svm_stalled_partitions 0.0" in generate_latest(
        daemon.metrics.registry).decode()


def test_the_lag_of_a_partition_given_up_is_no_longer_exported():
    # A daemon of a consumer group that gave a partition up kept exporting the last lag it
    # had seen of it (for 15 minutes in a soak), beside its new owner's series: the group's
    # lag summed over its members was wrong.
    from collections import namedtuple

    from prometheus_client import generate_latest

    from connectors.daemon import Daemon

    Partition = namedtuple("Partition", "topic partition")
    kept, given_up = Partition("in", 0), Partition("in", 1)

    class Consumer:
        def __init__(self):
            self.assigned = {kept, given_up}

        def assignment(self):
            return set(self.assigned)

        def paused(self):
            return set()

        def highwater(self, tp):
            return 20

        def position(self, tp, timeout_ms=None):
            return 11

    daemon = Daemon(load_config(None, {"metrics.enabled": False}, environ={}))
    daemon._consumer = consumer = Consumer()
    daemon._update_lag()
    text = generate_latest(daemon.metrics.registry).decode()
    assert 'stream_svm_consumer_lag{partition="1",topic="in"} 9.0' in text
    consumer.assigned = {kept}
    daemon._update_lag()
    text = generate_latest(daemon.metrics.registry).decode()
    assert 'stream_svm_consumer_lag{partition="0",topic="in"} 9.0' in text
    assert 'partition="1"' not in text
    consumer.assigned = {kept, given_up}  # given back: exported again
    daemon._update_lag()
    assert 'stream_svm_consumer_lag{partition="1",topic="in"} 9.0' in generate_latest(
        daemon.metrics.registry).decode()


@pytest.mark.parametrize("sliding", [False, True])
def test_only_a_sliding_window_exports_window_points(sliding):
    from prometheus_client import generate_latest

    from stream_svm import IncrementalSVC, SlidingWindowSVC

    model = SlidingWindowSVC(window_size=3, step=2) if sliding else IncrementalSVC()
    metrics = Metrics()
    processor = Processor(model, metrics=metrics)
    records = [Record("in", 0, i, json.dumps({"id": i, "x": {"a": float(i)}, "y": i % 2 == 0})
                      .encode(), 0) for i in range(5)]
    processor.process(records)
    text = generate_latest(metrics.registry).decode()
    assert f"stream_svm_stored_points {3.0 if sliding else 5.0}" in text
    assert "stream_svm_feature_names 1.0" in text
    if sliding:
        assert "stream_svm_window_points 3.0" in text  # the fifth arrival waits in the buffer
    else:
        assert "stream_svm_window_points" not in text


def test_processor_cache_limits_and_offsets():
    from stream_svm import IncrementalSVC

    now = [1_000.0]
    processor = Processor(IncrementalSVC(), cache_max_size=2, cache_max_age_seconds=10,
                          clock=lambda: now[0])

    def rec(offset, doc, ts):
        return Record("in", 0, offset, json.dumps(doc).encode(), ts)

    processor.process([rec(0, {"id": "a", "x": {"f": 1}}, 1_000),
                       rec(1, {"id": "b", "x": {"f": 2}}, 2_000),
                       rec(2, {"id": "c", "x": {"f": 3}}, 3_000)])
    assert list(processor.cache) == ["b", "c"]  # size limit drops the oldest
    now[0] += 5
    # A producer timestamp ten years ahead is no reason to evict anything: age is the
    # daemon's processing time.
    processor.process([rec(3, {"id": "d", "x": {"f": 4}}, 10**12 + 3_650 * 86_400_000)])
    assert list(processor.cache) == ["c", "d"]  # "b" made room for "d", not for its age
    now[0] += 6  # "c" was cached 11 s ago, "d" 6 s ago
    result = processor.process([rec(4, {"id": "a", "y": True}, 13_000),
                                rec(5, {"id": "d", "y": True}, 13_000)])
    assert "no unlabelled features cached for id 'a'" in result.dead_letters[0].record["error"]
    assert result.dead_letters[0].record["reason"] == "unknown_id"
    assert result.outputs[0].record == {"id": "d", "op": "label", "ok": True,
                                        "source": {"topic": "in", "partition": 0, "offset": 5}}
    assert json.loads(result.outputs[0].value) == result.outputs[0].record
    # With no cache, a late label is refused naming the setting (it said "never seen,
    # expired, or already labelled", none of which was the case).
    uncached = Processor(IncrementalSVC(), cache_max_size=0, clock=lambda: now[0])
    uncached.process([rec(0, {"id": "a", "x": {"f": 1}}, 1_000)])
    result = uncached.process([rec(1, {"id": "a", "y": True}, 2_000)])
    assert "cache.max_size or cache.max_bytes 0" in result.dead_letters[0].record["error"]
    assert "d" in processor.model and processor.offsets == {"in:0": 6}
    assert list(processor.cache) == [] and processor.cache.evictions == {"entries": 2, "age": 1}
    # Already processed offsets are skipped (the model never learns a message twice).
    again = processor.process([rec(5, {"id": "d", "y": True}, 13_000)])
    assert again.skipped == 1 and not again.outputs and not again.dead_letters


def test_a_restart_slower_than_the_cache_age_reads_answered_labels_again():
    # Cached points kept the wall-clock time they were cached at, and a restore evicted them
    # by age: a label answered "ok" before a crash found its point expired when the restart
    # read it again, and was dead-lettered unknown_id (the model never learned it).
    from stream_svm import IncrementalSVC

    now = [1_000.0]

    def rec(offset, doc):
        return Record("in", 0, offset, json.dumps(doc).encode(), 0)

    first = Processor(IncrementalSVC(), cache_max_age_seconds=20, clock=lambda: now[0])
    first.process([rec(0, {"id": "a", "x": {"f": 1.0}}), rec(1, {"id": "b", "x": {"f": 2.0}})])
    state, arrays = json.loads(json.dumps(first.state())), first.cache_arrays()
    now[0] += 15
    answered = first.process([rec(2, {"id": "a", "y": True})])
    assert answered.outputs[0].record["ok"] is True
    now[0] += 60  # the crash, and a restart a minute later, from the checkpoint before it
    restarted = Processor(IncrementalSVC(), cache_max_age_seconds=20, clock=lambda: now[0])
    restarted.load_state(state, arrays)
    assert list(restarted.cache) == ["a", "b"]
    now[0] += 1
    again = restarted.process([rec(2, {"id": "a", "y": True})])
    assert not again.dead_letters and again.outputs[0].record["ok"] is True
    assert "a" in restarted.model
    # The cache's own time goes on: 21 s of it since "b" was cached, it expires as it would
    # have in a daemon that never stopped.
    now[0] += 20
    restarted.expire_cache()
    assert list(restarted.cache) == []
    # A second restart after a second long downtime: the first downtime ages nothing either
    # (the checkpoint must save the cache's own clock, not the wall clock, which would make
    # the second restart count the first downtime).
    restarted.process([rec(3, {"id": "c", "x": {"f": 3.0}})])
    second_state, second_arrays = json.loads(json.dumps(restarted.state())), \
        restarted.cache_arrays()
    now[0] += 600
    twice = Processor(IncrementalSVC(), cache_max_age_seconds=20, clock=lambda: now[0])
    twice.load_state(second_state, second_arrays)
    now[0] += 5
    twice.expire_cache()
    assert list(twice.cache) == ["c"]
    # A model of a group read back from the state topic goes on from its state's clock when
    # the state was written before its daemon started (a crash's restart, whose replayed
    # labels the daemon had acknowledged), and keeps the wall clock when it was written
    # while the daemon ran (evicted, handed over): its points aged as they did.
    fetched = Processor(IncrementalSVC(), cache_max_age_seconds=20, clock=lambda: now[0])
    fetched.load_state(state, arrays, resume_before=state["saved_at"] + 1)
    assert list(fetched.cache) == ["a", "b"]
    fetched = Processor(IncrementalSVC(), cache_max_age_seconds=20, clock=lambda: now[0])
    fetched.load_state(state, arrays, resume_before=state["saved_at"])
    assert list(fetched.cache) == []


def test_cli_parses_commands_and_reports_bad_settings(capsys):
    args = build_parser().parse_args(
        ["serve", "--config", "c.toml", "--bootstrap-servers", "h:1", "--set", "model.C=2"])
    assert args.bootstrap_servers == "h:1" and args.settings == [("model.C", "2")]
    assert main(["serve", "--set", "model.C=-3"]) == 2
    assert "model.C" in capsys.readouterr().err
    command = ["evaluate", "--dataset", "bananas", "--limit", "200", "--set", "model.gamma=1"]
    assert main(command) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["points"] == 200 and 0.5 < report["accuracy"] <= 1.0
    assert main(["evaluate", "--dataset", "no-such-source"]) == 2
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--set", "novalue"])


def test_a_named_label_without_classes_points_to_the_classes_setting():
    from connectors.messages import Malformed, Targets

    with pytest.raises(Malformed, match=r'label "ham" is not one of the two classes .*'
                                        r"set model\.classes = \[negative, positive\]"):
        Targets().parse("ham")
    with pytest.raises(Malformed, match=r"label 2\.5 is not one of the two classes \(true/1 "
                                        r"positive, false/0/-1 negative\); to predict a number, "
                                        r"use a regressor \(model\.type = \"IncrementalSVR\"\)"):
        Targets().parse(2.5)  # a number: a quantity, most likely
    assert Targets(classes=("ham", "spam")).parse("ham") is False


def test_updates_completed_afresh_are_counted_for_the_operator(monkeypatch):
    from prometheus_client import generate_latest

    from stream_svm import IncrementalSVC
    from stream_svm.engine import PathEngine

    model = IncrementalSVC(kernel="linear")
    metrics = Metrics()
    processor = Processor(model, metrics=metrics)
    rng = np.random.default_rng(8)
    records = [Record("in", 0, i, json.dumps({"id": i, "x": {"a": float(a), "b": float(b)},
                                               "y": bool(a > 0)}).encode(), 0)
               for i, (a, b) in enumerate(rng.normal(size=(6, 2)))]
    processor.process(records[:5])
    holds = PathEngine._kkt_holds
    # The model's own engine derails on every path, point by point too; learned afresh, the
    # points hold their conditions.
    monkeypatch.setattr(PathEngine, "_kkt_holds",
                        lambda self: self is not model._engine and holds(self))
    processor.process(records[5:])
    monkeypatch.undo()
    assert model.retries_total == model.relearns_total == 1 and 5 in model
    text = generate_latest(metrics.registry).decode()
    assert 'stream_svm_update_retries_total{how="afresh"} 1.0' in text
    assert 'how="one_at_a_time"' not in text


def test_a_windows_model_updates_do_not_depend_on_where_polls_or_restarts_cut_a_slide():
    # Buffered arrivals counted as they came: a restart between two polls reported the same
    # window model as 51 updates where the uninterrupted run said 48.
    from stream_svm import SlidingWindowSVC

    rng = np.random.default_rng(0)
    messages = [{"id": i, "x": {"a": float(a), "b": float(b)}, "y": bool(a > 0)}
                for i, (a, b) in enumerate(rng.normal(size=(80, 2)))]
    records = [Record("in", 0, i, json.dumps(m).encode(), 0) for i, m in enumerate(messages)]

    def updates(result):
        return {o.record["id"]: o.record["model_updates"] for o in result.outputs}

    whole = Processor(SlidingWindowSVC(window_size=20, step=4))
    expected = {}
    for start in range(0, 80, 7):
        expected.update(updates(whole.process(records[start : start + 7])))
    for cut in (22, 23, 25, 61):
        first = Processor(SlidingWindowSVC(window_size=20, step=4))
        seen = {}
        for start in range(0, cut, 5):
            seen.update(updates(first.process(records[start : min(start + 5, cut)])))
        arrays, meta = first.model.to_checkpoint()
        restarted = Processor(SlidingWindowSVC.from_checkpoint(arrays, meta))
        restarted.load_state(json.loads(json.dumps(first.state())))
        for start in range(cut, 80, 9):
            seen.update(updates(restarted.process(records[start : start + 9])))
        assert seen == expected, cut


def test_a_point_a_window_leaves_out_of_its_buffer_is_dead_lettered_and_the_stream_goes_on():
    # A point no slide could learn (1e6 among unit-scale features, linear kernel: a window of
    # 8 never holds the 10 points the far-point check needs) was answered "learned": true
    # when buffered, then every later message of the stream was dead-lettered "refused".
    import warnings

    from stream_svm import SlidingWindowSVR

    rng = np.random.default_rng(5)
    messages = [{"id": i, "x": {"u": float(u), "v": float(v)}, "y": float(u - v)}
                for i, (u, v) in enumerate(rng.uniform(-1, 1, size=(12, 2)))]
    messages.append({"id": "far", "x": {"u": 1e6}, "y": 0.5})
    messages += [{"id": i, "x": {"u": float(u), "v": float(v)}, "y": float(u - v)}
                 for i, (u, v) in enumerate(rng.uniform(-1, 1, size=(30, 2)), start=12)]
    records = [Record("in", 0, i, json.dumps(m).encode(), 0) for i, m in enumerate(messages)]
    processor = Processor(SlidingWindowSVR(window_size=8, step=3, kernel="linear"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the library's own warning of the same)
        results = [processor.process(records[start : start + 5]) for start in range(0, 43, 5)]
    letters = [letter.record for result in results for letter in result.dead_letters]
    assert [(letter["id"], letter["reason"]) for letter in letters] == [("far", "refused")]
    assert letters[0]["error"].startswith(
        "the point 'far', buffered by the window (its message was answered \"learned\": true), "
        "was left out: the window's slide was refused with it")
    outputs = [output.record for result in results for output in result.outputs]
    assert len(outputs) == 43 and all(output["learned"] for output in outputs)
    # Its update is no longer counted: the count is that of the points the window took.
    assert processor.model_updates == 42 - processor.model.n_buffered
    assert "far" not in processor.model


def test_a_point_an_alpha_isvm_leaves_out_of_its_buffer_is_dead_lettered_by_its_features():
    import warnings

    from stream_svm import AlphaISVC

    rng = np.random.default_rng(0)
    messages = [{"id": i, "x": {"a": float(a), "b": float(b)}, "y": bool(a > 0)}
                for i, (a, b) in enumerate(rng.uniform(-1, 1, size=(12, 2)))]
    messages.append({"id": "far", "x": {"a": 1e6}, "y": False})
    messages += [{"id": i, "x": {"a": 0.05 * i - 0.5, "b": 0.3}, "y": bool(i % 2)}
                 for i in range(12, 32)]
    records = [Record("in", 0, i, json.dumps(m).encode(), 0) for i, m in enumerate(messages)]
    processor = Processor(AlphaISVC(batch_size=3, kernel="linear", C=100.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the library's own warning of the same)
        results = [processor.process(records[start : start + 4]) for start in range(0, 33, 4)]
    letters = [letter.record for result in results for letter in result.dead_letters]
    assert [(letter.get("id"), letter["reason"]) for letter in letters] == [(None, "refused")]
    assert letters[0]["error"].startswith(
        "a point buffered by the model (its message was answered \"learned\": true) was left "
        "out: the sample with features {'a': 1000000.0} and label False was refused with it")
    assert letters[0]["source"]["offset"] == 14  # (the arrival that made the increment)
    assert processor.model_updates == 32 - processor.model.n_buffered


def test_a_daemon_checkpoint_loads_offline_and_predicts_as_the_daemon(tmp_path):
    from connectors.daemon import Daemon
    from connectors.models import build_model, load_served_model

    config = load_config(None, {
        "model.classes": ["legit", "fraud"], "scaler.mode": "fixed",
        "scaler.means": {"amount": 50.0}, "scaler.scales": {"amount": 40.0},
        "checkpoint.dir": str(tmp_path / "ckpt"), "metrics.enabled": False}, environ={})
    daemon = Daemon(config)
    daemon.processor = daemon._new_processor(build_model(config))
    daemon._store = CheckpointStore(config.checkpoint.dir)
    rng = np.random.default_rng(5)
    records = []
    for i in range(40):
        amount = float(rng.normal(50, 40))
        label = "fraud" if amount + rng.normal(0, 10) > 60 else "legit"
        records.append(Record("in", 0, i, json.dumps(
            {"id": i, "x": {"amount": amount, "hour": float(i % 24)}, "y": label}).encode(), 0))
    daemon.processor.process(records)
    daemon.checkpoint()
    # A newer checkpoint that does not read back is skipped.
    (tmp_path / "ckpt" / "checkpoint-99999999.npz").write_bytes(b"not a zip")

    served = load_served_model(tmp_path / "ckpt")
    assert served.path.name != "checkpoint-99999999.npz"
    probe = {"amount": 95.0, "hour": 3.0}
    answered = daemon.processor.process([Record("in", 0, 40, json.dumps(
        {"id": "q", "x": probe}).encode(), 0)]).outputs[0].record
    assert served.predict_one(probe) == answered["prediction"]
    assert served.predict_proba_one(probe)["fraud"] == pytest.approx(answered["proba"], abs=1e-12)
    assert served.features(probe) == {"amount": (95.0 - 50.0) / 40.0, "hour": 3.0}
    assert served.predict_one({"amount": np.float64(95.0), "hour": np.int64(3)}) == \
        served.predict_one(probe)
    # What the daemon dead-letters as malformed is refused here too: it answered NaN, true and
    # null (the daemon refuses a producer's encoding slips rather than read them as numbers).
    for offset, value in enumerate((float("nan"), True, None, "95"), start=41):
        with pytest.raises(ValueError, match="feature 'amount' must be a finite number"):
            served.predict_one({"amount": value, "hour": 3.0})
        error = daemon.processor.process([Record("in", 0, offset, json.dumps(
            {"id": "r", "x": {"amount": value, "hour": 3.0}}).encode(), 0)]).dead_letters
        assert error and error[0].record["reason"] == "malformed", value
    with pytest.raises(CheckpointError, match="is not a directory"):
        load_served_model(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()


def test_unsaved_seconds_are_zero_once_a_checkpoint_holds_everything(monkeypatch):
    import connectors.metrics as metrics_module

    now = [100.0]
    monkeypatch.setattr(metrics_module.time, "monotonic", lambda: now[0])
    metrics = Metrics()

    def value(name):
        for line in metrics.render().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(name)

    now[0] = 130.0
    assert value("stream_svm_seconds_unsaved") == 0.0  # idle since start: nothing to save
    metrics.processed_unsaved()
    now[0] = 134.0
    metrics.processed_unsaved()  # the oldest unsaved message counts
    now[0] = 137.0
    assert value("stream_svm_seconds_unsaved") == 7.0
    metrics.checkpointed(0.01)
    now[0] = 200.0
    assert value("stream_svm_seconds_unsaved") == 0.0
    assert value("stream_svm_seconds_since_checkpoint") == 63.0


def test_sasl_credentials_without_a_sasl_mechanism_are_reported_unused(caplog):
    from connectors.config import kafka_client_settings

    config = load_config(None, {"kafka.bootstrap_servers": "k:9092"}, environ={})
    with caplog.at_level("WARNING", logger="stream_svm.config"):
        settings = kafka_client_settings(config, {"STREAM_SVM_SASL_USERNAME": "svc"})
    assert "sasl_plain_username" not in settings
    assert "STREAM_SVM_SASL_USERNAME / STREAM_SVM_SASL_PASSWORD are set but not used" in caplog.text


@pytest.mark.parametrize("setting", ["ssl_cafile", "ssl_certfile", "ssl_keyfile"])
def test_a_tls_file_that_is_missing_is_named_at_start(tmp_path, setting):
    # The client logged "No such file or directory" at every connection attempt, for ever,
    # naming neither the file nor the setting.
    from connectors.config import kafka_client_settings

    missing = tmp_path / "ca.pem"
    config = load_config(None, {"kafka.bootstrap_servers": "k:9093",
                                "kafka.security_protocol": "SSL",
                                f"kafka.{setting}": str(missing)}, environ={})
    with pytest.raises(ConfigError, match=rf"kafka\.{setting}: '.*ca\.pem' is not a readable"):
        kafka_client_settings(config, {})
    tls = Path(__file__).parent / "data" / "tls"
    missing.write_text({
        "ssl_cafile": (tls / "ca.pem").read_text(),
        # (a certificate and its key in one file, as load_cert_chain reads them)
        "ssl_certfile": (tls / "server.pem").read_text() + (tls / "server.key").read_text(),
        "ssl_keyfile": (tls / "server.key").read_text(),
    }[setting])
    assert kafka_client_settings(config, {})[setting] == str(missing)


def test_the_stop_event_can_be_set_by_a_signal_handler_that_interrupted_its_wait():
    # A handler runs on the main thread between two bytecodes, possibly inside wait() while
    # the event's lock is held: threading.Event's set() then blocked forever (a broker that
    # ignored SIGTERM). Done on a helper thread here, so that a regression fails, not hangs.
    import threading

    from connectors.daemon import SignalSafeEvent

    event = SignalSafeEvent()
    done = threading.Event()

    def handler_inside_wait() -> None:
        with event._cond:  # what wait() holds between its bytecodes
            event.set()  # what the handler does
        done.set()

    threading.Thread(target=handler_inside_wait, daemon=True).start()
    assert done.wait(5) and event.is_set()
    assert event.wait(0)


def test_a_forget_of_an_id_reserve_truncation_discarded_says_it_may_have_been_learned():
    # An erasure flow read "forget of unknown id 8 (not in the model)" for ids the model had
    # learned and discarded since (model.reserve_epsilon): as if it had never held them.
    from stream_svm import IncrementalSVC

    rng = np.random.default_rng(3)
    processor = Processor(IncrementalSVC(C=1.0, gamma=0.5, reserve_epsilon=0.0))
    records = []
    for i in range(80):
        a, b = rng.normal(size=2)
        records.append(Record("in", 0, i, json.dumps(
            {"id": i, "x": {"a": a, "b": b}, "y": bool(a + 0.2 * b > 0)}).encode(), 0))
    processor.process(records)
    discarded = [i for i in range(80) if i not in processor.model]
    assert discarded and processor.model.reserve_discarded == len(discarded)
    outcome = processor.process([
        Record("in", 0, 80, json.dumps({"op": "forget", "id": discarded[0]}).encode(), 0),
        Record("in", 0, 81, json.dumps({"op": "forget", "id": 999}).encode(), 0)])
    errors = [letter.record for letter in outcome.dead_letters]
    assert [error["reason"] for error in errors] == ["unknown_id", "unknown_id"]
    for error in errors:
        assert "never learned, or learned and discarded since by reserve truncation" in \
            error["error"]
    plain = Processor(IncrementalSVC())
    letters = plain.process([Record("in", 0, 0, b'{"op": "forget", "id": 5}', 0)]).dead_letters
    assert letters[0].record["error"] == "forget of unknown id 5 (not in the model)"


def test_cache_evictions_and_skipped_messages_are_counted_once_each():
    # Each eviction is reported once (reporting every eviction since the start at each
    # batch would grow the counter by 1, 2, 3 for one eviction per batch); messages skipped
    # below the next offsets (read again after a restart) are counted, not only logged.
    from stream_svm import IncrementalSVC

    metrics = Metrics()
    processor = Processor(IncrementalSVC(), cache_max_size=1, metrics=metrics)

    def value(line_start):
        for line in metrics.render().decode().splitlines():
            if line.startswith(line_start):
                return float(line.split()[-1])
        return 0.0

    records = [Record("in", 0, i, json.dumps({"id": i, "x": {"f": float(i)}}).encode(), 0)
               for i in range(4)]
    for record in records:
        processor.process([record])
    assert value('stream_svm_cache_evictions_total{reason="entries"}') == 3
    processor.process(records[:2])  # read again: below the next offset
    assert value('stream_svm_messages_total{outcome="skipped"}') == 2


def test_features_that_replace_those_waiting_for_their_label_are_counted():
    """Two unlabelled messages of one id: the label learns the newer features, and the older
    ones, dropped, are counted (reason replaced) rather than discarded without a trace."""
    from stream_svm import IncrementalSVC

    metrics = Metrics()
    processor = Processor(IncrementalSVC(), metrics=metrics)
    processor.process([Record("in", 0, 0, b'{"id": "u", "x": {"a": 1.0}}', 0),
                       Record("in", 0, 1, b'{"id": "u", "x": {"a": -3.0}}', 0),
                       Record("in", 0, 2, b'{"id": "v", "x": {"a": 2.0}}', 0)])
    processor.process([Record("in", 0, 3, b'{"id": "u", "y": true}', 0)])
    assert processor.model.stored_point("u") == ({"a": -3.0}, True)
    assert processor.cache.evictions == {"replaced": 1}
    rendered = metrics.render().decode()
    assert 'stream_svm_cache_evictions_total{reason="replaced"} 1.0' in rendered


def test_an_unknown_id_spelt_as_a_held_id_of_the_other_type_names_it():
    """Ids compare with their JSON type: a forget of "6" for the point learned as 6 leaves
    the point learned, and the dead letter names the id held and what to send."""
    from stream_svm import IncrementalSVC

    processor = Processor(IncrementalSVC())
    processor.process([
        Record("in", 0, 0, b'{"id": 6, "x": {"a": 1.0}, "y": true}', 0),
        Record("in", 0, 1, b'{"id": "7", "x": {"a": -1.0}, "y": false}', 0),
        Record("in", 0, 2, b'{"id": 8, "x": {"a": 0.5}}', 0)])  # waits for its label
    outcome = processor.process([
        Record("in", 0, 3, b'{"op": "forget", "id": "6"}', 0),
        Record("in", 0, 4, b'{"op": "relabel", "id": 7, "y": true}', 0),
        Record("in", 0, 5, b'{"id": "8", "y": true}', 0),
        Record("in", 0, 6, b'{"op": "forget", "id": "06"}', 0),
        Record("in", 0, 7, b'{"op": "forget", "id": "--7"}', 0)])
    errors = [letter.record["error"] for letter in outcome.dead_letters]
    assert errors == [
        "forget of unknown id '6' (not in the model, which holds the id 6: ids compare with "
        "their JSON type, send 6)",
        "relabel of unknown id 7 (not in the model, which holds the id '7': ids compare with "
        "their JSON type, send \"7\")",
        "no unlabelled features cached for id '8', but for the id 8: ids compare with their "
        "JSON type, send 8",
        "forget of unknown id '06' (not in the model)",
        "forget of unknown id '--7' (not in the model)"]
    assert {letter.record["reason"] for letter in outcome.dead_letters} == {"unknown_id"}
    assert 6 in processor.model and "7" in processor.model and 8 in processor.cache


def test_an_unknown_id_dead_letter_carries_the_daemons_hint_and_the_model():
    """A daemon reading several partitions, or one of per-key models, sets what an unknown_id
    dead letter adds: the id's learning message may be on another partition or model."""
    from stream_svm import IncrementalSVC

    processor = Processor(IncrementalSVC())
    processor.unknown_id_hint = "; the hint"
    processor.output_fields = {"model": "3/k"}
    letters = processor.process([
        Record("in", 0, 0, b'{"op": "forget", "id": 5}', 0),
        Record("in", 0, 1, b'{"id": 5, "y": true}', 0)]).dead_letters
    assert [letter.record["error"] for letter in letters] == [
        "forget of unknown id 5 (not in the model); the hint",
        "no unlabelled features cached for id 5 (never seen, expired, or already labelled); "
        "the hint"]
    assert [letter.record["model"] for letter in letters] == ["3/k", "3/k"]


@pytest.mark.parametrize("raw,error", [
    (b'{"id": 1, "x": {"a": 1e309}, "y": true}',
     "feature 'a' is too large for a float: its magnitude is beyond 1.8e+308"),
    (b'{"id": 1, "x": {"a": ' + b"1" * 5001 + b'}, "y": true}',
     f"not usable JSON: an integer has more than {sys.get_int_max_str_digits()} digits"),
    (b'{"id": 1, "features": {"a": 1.0}, "y": true}',
     "unknown field(s) 'features' in a label, whose fields are 'id', 'y'; a feature message "
     "carries its features in 'x' ('id', 'x', 'y')"),
    (json.dumps(json.dumps({"id": 1, "x": {"a": 1.0}})).encode(),
     "a message must be a JSON object, got a JSON string holding one: the message was encoded "
     "twice (send the object's JSON once)"),
    # JSON's names for what was sent, not Python's (NoneType, bool, True, 'text', inf):
    (b"null", "a message must be a JSON object, got null"),
    (b"[1, 2]", "a message must be a JSON object, got [1, 2]"),
    (b'{"id": 1, "x": null}', "'x' must be an object of feature: number, got null"),
    (b'{"id": 1, "x": {"a": true}}', "feature 'a' must be a finite number, got true"),
    (b'{"id": 1, "op": null}', 'unknown op null (known: "forget", "relabel")'),
    (b'{"id": 1, "op": ["forget"]}', 'unknown op ["forget"] (known: "forget", "relabel")'),
    (b'{"id": 1, "x": {"a": "3.5"}}', "feature 'a' must be a finite number, got \"3.5\""),
    (b'{"id": 1, "y": null}', "a label needs a value for 'y', not null (null marks a message "
                              "with features as unlabelled)"),
    (b'{"id": 1, "x": {"a": 1.0}, "y": 1e400}',
     "label is too large for a float: its magnitude is beyond 1.8e+308"),
    (b'{"id": 1e400, "x": {"a": 1.0}}',
     "'id' must be a string or an integer, got a number beyond the float range"),
    # where a NaN stands, a field name in the wrong case, an empty message:
    (b'{"id": 1, "x": {"a": 1.0, "b\\"c": NaN}}',
     "non-finite number NaN (the value of 'b\"c') is not allowed: JSON has no such number "
     "(where a value is missing, leave the field out)"),
    (b'{"id": 1, "x": {"a": [NaN], "b": NaN}}',  # (the decoder stops at the first)
     "non-finite number NaN is not allowed: JSON has no such number (where a value is "
     "missing, leave the field out)"),
    (b'{"id": 1, "s": "NaN \\" : NaN", "x": {"q": -Infinity}}',  # (not in a string)
     "non-finite number -Infinity (the value of 'q') is not allowed: JSON has no such number "
     "(where a value is missing, leave the field out)"),
    (b'{"id": 1, "s": "' + b'\\"' * 100_000 + b'", "x": {"a": NaN}}',  # (read in one pass)
     "non-finite number NaN (the value of 'a') is not allowed: JSON has no such number "
     "(where a value is missing, leave the field out)"),
    (b'{"id": 1, "X": {"a": 1.0}}',
     "missing 'x' (features) and 'op' (found 'X': field names are lower case)"),
    (b'{"id": 1, "vector": [1.0]}', "missing 'x' (features) and 'op' (its fields: 'id', "
                                     "'vector')"),
    (b"", "empty message (0 bytes)"),
    (b" \n", "empty message (2 bytes, all blank)"),
])
def test_a_malformed_message_is_named_as_its_sender_wrote_it(raw, error):
    """What the sender wrote, not what Python made of it: 1e309 is a finite literal (not
    "inf"), and Python's advice on long integers names a call the sender cannot make."""
    with pytest.raises(Malformed) as refused:
        parse_message(raw, 10**6)
    assert str(refused.value) == error


def test_a_forget_on_the_label_topic_says_where_it_goes_and_a_huge_target_is_named():
    with pytest.raises(Malformed, match=r"unknown field\(s\) 'op' in a label, whose fields are "
                                        r"'id', 'y'; forgets and relabels go on the input topic"):
        parse_label(b'{"op": "forget", "id": 7}', 10**6)
    with pytest.raises(Malformed, match=r"^unknown field\(s\) 'x' in a label, whose fields are "
                                        r"'id', 'y'; feature messages go on the input topic$"):
        parse_label(b'{"id": 7, "x": {"a": 1.0}, "y": true}', 10**6)
    with pytest.raises(Malformed, match=r"^unknown field\(s\) 'timestamp' in a label, whose "
                                        r"fields are 'id', 'y'$"):  # (no feature message)
        parse_label(b'{"id": 7, "y": true, "timestamp": 5}', 10**6)
    with pytest.raises(Malformed, match=r"^target is too large for a float: its magnitude is "
                                        r"beyond 1.8e\+308$"):
        parse_message(b'{"id": 1, "x": {"a": 1.0}, "y": -1e400}', 10**6,
                      Targets(regression=True))


def test_bootstrap_servers_may_be_a_toml_array(tmp_path):
    path = tmp_path / "servers.toml"
    path.write_text('[kafka]\nbootstrap_servers = ["k1:9092", "k2:9092"]\n')
    assert load_config(path, {}, {}).kafka.bootstrap_servers == "k1:9092,k2:9092"
    path.write_text('[kafka]\nbootstrap_servers = ["k1:9092", 9092]\n')
    with pytest.raises(ConfigError, match=r"bootstrap_servers .* is not a str"):
        load_config(path, {}, {})


@pytest.mark.parametrize("make", ["IncrementalSVC", "IncrementalLSSVC"])
def test_the_feature_names_a_model_holds_are_a_gauge(make):
    """A few messages with many feature names make every later update and prediction cost
    about points x names: the gauge shows the model widened (and narrowing again when the
    names are dropped), per model with model.scope partition or key."""
    from prometheus_client import generate_latest

    import stream_svm

    for per_model in (False, True):
        metrics = Metrics(per_model=per_model)
        seen = metrics.for_model("m1")
        processor = Processor(getattr(stream_svm, make)(), metrics=seen)
        wide = {f"w{i}": 0.01 for i in range(40)}
        records = [Record("in", 0, i, json.dumps(
            {"id": i, "x": {"a": float(i), **(wide if i == 3 else {})}, "y": i % 2 == 0})
            .encode(), 0) for i in range(5)]
        processor.process(records)
        text = generate_latest(metrics.registry).decode()
        label = '{model="m1"}' if per_model else ""
        assert f"stream_svm_feature_names{label} 41.0" in text


def test_far_points_are_counted_for_the_operator_refused_or_not(monkeypatch):
    # Warned of once per process and model type (a log line); a count shows every one, with
    # one model per key too, and the point's own update is often refused.
    from prometheus_client import generate_latest

    import stream_svm._engine_model as engine_model
    from stream_svm import IncrementalSVR

    monkeypatch.setattr(engine_model, "_SCALE_WARNED", set())
    model = IncrementalSVR(kernel="linear")
    metrics = Metrics()
    processor = Processor(model, metrics=metrics)
    rng = np.random.default_rng(3)
    documents = [{"id": i, "x": {"a": float(a), "b": float(b)}, "y": float(a)}
                 for i, (a, b) in enumerate(rng.uniform(-2, 2, size=(30, 2)))]
    documents.append({"id": "glitch", "x": {"a": 1e16, "b": 0.5}, "y": 1.0})
    records = [Record("in", 0, i, json.dumps(d).encode(), 0) for i, d in enumerate(documents)]
    processor.process(records[:30])
    assert "stream_svm_far_points_total 0.0" in generate_latest(metrics.registry).decode()
    with pytest.warns(UserWarning, match="far beyond"):
        result = processor.process(records[30:])
    refused = [d.record for d in result.dead_letters if d.record.get("reason") == "refused"]
    assert refused and "glitch" not in model  # (this one's own update is refused)
    assert "stream_svm_far_points_total 1.0" in generate_latest(metrics.registry).decode()


def test_giving_up_counts_its_attempts_in_words():
    import threading

    from connectors.daemon import DaemonError, _Backoff

    for attempts, said in ((1, "giving up after 1 attempt: refused"),
                           (2, "giving up after 2 attempts: refused")):
        backoff = _Backoff(0.0, 0.0, attempts)
        with pytest.raises(DaemonError, match=f"^broker: {said}$"):
            for _ in range(attempts):
                backoff.wait(threading.Event(), "broker", ConnectionRefusedError("refused"))


def test_a_read_only_checkpoint_directory_is_locked_through_its_lock_file(tmp_path, monkeypatch,
                                                                          caplog):
    # A file system remounted read-only: the lock file could not be opened for writing and
    # every start stopped (exit 1), a crash loop. A lock file left there locks read-only as
    # well (flock needs no write): the daemon starts, its checkpoints failing, logged.
    import errno

    import connectors.checkpoint
    from connectors.checkpoint import DirectoryLock

    directory = tmp_path / "checkpoints"
    directory.mkdir()  # (a directory it made, left empty but for the lock, it would remove)
    first = DirectoryLock(directory)
    first.acquire()
    first.release()
    real_open = os.open

    def read_only(path, flags, *mode):
        if flags & (os.O_RDWR | os.O_WRONLY | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *mode)

    # The pid there is an earlier daemon's, which has stopped.
    (directory / ".lock").write_text("999999999")
    monkeypatch.setattr(connectors.checkpoint.os, "open", read_only)
    lock = DirectoryLock(directory)
    lock.acquire()
    assert lock.held()
    assert "cannot be written (Read-only file system): locked through its existing lock file" \
        in caplog.text
    # (the read-only lock excludes as the other does, and does not blame the stopped daemon)
    with pytest.raises(CheckpointError, match=r"in use by another daemon \(its lock file names "
                                              r"process 999999999, which is not running"):
        DirectoryLock(directory).acquire()
    lock.verify()  # still read-only: nothing written, nothing raised
    assert (directory / ".lock").read_text() == "999999999"
    monkeypatch.setattr(connectors.checkpoint.os, "open", real_open)
    # Writable again, but the lock file replaced meanwhile (another daemon may lock the new
    # one): not this lock's to write into.
    (directory / ".lock").rename(directory / ".lock-held")
    (directory / ".lock").write_text("4242")
    lock.catch_up_pid()
    assert (directory / ".lock").read_text() == "4242"
    (directory / ".lock-held").replace(directory / ".lock")
    lock.catch_up_pid()  # writable again: the daemon's lock check (every second) writes it
    assert (directory / ".lock").read_text() == str(os.getpid())
    with pytest.raises(CheckpointError, match=rf"\(process {os.getpid()}, as its lock file says"):
        DirectoryLock(directory).acquire()
    monkeypatch.setattr(connectors.checkpoint.os, "open", read_only)
    lock.release()
    (directory / ".lock").unlink()
    # Without a lock file there is nothing to lock: refused by name, as before.
    with pytest.raises(CheckpointError, match=r"cannot open the lock file .*Read-only file"):
        DirectoryLock(directory).acquire()
