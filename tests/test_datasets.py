"""Tests of the river-flow loader, on the real files (skipped when absent) and on small fakes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from river.datasets import base

from stream_svm.datasets import (
    RiverFlow,
    available_rivers,
    load_river_flow,
    read_daily_series,
    river_flow_feature_names,
)

FISHER_NAMES = [
    *(f"temperature_lag{k}" for k in range(1, 8)),
    *(f"precipitation_lag{k}" for k in range(1, 8)),
    *(f"flow_lag{k}" for k in range(1, 8)),
]


def _values_by_hand(path: Path) -> list[float]:
    """The numbers of a series file, parsed independently of the module under test."""
    lines = path.read_text().splitlines()[1:]
    return [float(line) for line in lines if line.strip() and not line.startswith("#")]


def _write_series(path: Path, values: list[object], title: str = "A test series") -> Path:
    text = "\n".join([title, "# comment 1", "# comment 2", "# comment 3", *map(str, values)])
    path.write_text(text + "\n\n")
    return path


def _write_river(
    directory: Path,
    temperature: list[float],
    precipitation: list[float],
    flow: list[float],
    river: str = "toy",
) -> Path:
    _write_series(directory / f"{river}t.dat", temperature)
    _write_series(directory / f"{river}p.dat", precipitation)
    _write_series(directory / f"{river}.dat", flow)
    return directory


@pytest.fixture
def fisher_dir(shared_data: Path) -> Path:
    return shared_data / "fisher-river"


@pytest.fixture
def more_rivers_dir(shared_data: Path) -> Path:
    return shared_data / "more-rivers"


# --- the real data ---------------------------------------------------------------------------


def test_fisher_task_has_the_papers_counts(fisher_dir: Path) -> None:
    X, y, names = load_river_flow(fisher_dir, "fisher")
    assert X.shape == (1454, 21)
    assert y.shape == (1454,)
    assert set(np.unique(y)) == {-1.0, 1.0}
    assert int((y == 1.0).sum()) == 563
    assert int((y == -1.0).sum()) == 891
    assert names == FISHER_NAMES


def test_fisher_flow_target_is_the_next_samples_first_flow_lag(fisher_dir: Path) -> None:
    X, y, names = load_river_flow(fisher_dir, "fisher", scaled=False, target="flow")
    rises = load_river_flow(fisher_dir, "fisher")[1]
    assert y.shape == (1454,) and np.all(y >= 0)
    # Today's flow is tomorrow's flow_lag1, and rises are the flow going up.
    np.testing.assert_array_equal(y[:-1], X[1:, names.index("flow_lag1")])
    np.testing.assert_array_equal(rises > 0, y > X[:, names.index("flow_lag1")])


def test_the_cli_source_reads_any_river_and_the_flow_target(more_rivers_dir: Path) -> None:
    from connectors.sources import SourceError, iter_source, raw_label

    pairs = list(iter_source(f"river-flow:{more_rivers_dir}#oldman", target="flow",
                             read_label=raw_label))
    X, flow, names = load_river_flow(more_rivers_dir, "oldman", scaled=False, target="flow")
    assert [y for _, y in pairs] == flow.tolist()
    # The features in the files' units, as a producer sends them (min-max scaled over the
    # whole series, yesterday's flow was not the flow of the day before).
    assert [x["flow_lag1"] for x, _ in pairs] == X[:, names.index("flow_lag1")].tolist()
    assert pairs[1][0]["flow_lag1"] == pairs[0][1]
    rises = list(iter_source(f"river-flow:{more_rivers_dir}#oldman"))
    assert {y for _, y in rises} == {True, False}
    with pytest.raises(SourceError, match="the target is one of"):
        list(iter_source(f"river-flow:{more_rivers_dir}#oldman", target="level"))


def test_fisher_first_sample_holds_the_first_seven_days_newest_first(fisher_dir: Path) -> None:
    X, y, names = load_river_flow(fisher_dir, "fisher", scaled=False)
    first = dict(zip(names, X[0], strict=True))
    for variable, suffix in (("temperature", "t"), ("precipitation", "p"), ("flow", "")):
        days = _values_by_hand(fisher_dir / f"fisher{suffix}.dat")
        # Sample 0 predicts day 7 (0-based): lag1 is day 6, lag7 is day 0, the file's first value.
        assert [first[f"{variable}_lag{k}"] for k in range(7, 0, -1)] == days[:7]
    flow = _values_by_hand(fisher_dir / "fisher.dat")
    # Read straight off fisher.dat, lines 5-11; lag7 is the oldest day, lag1 the newest.
    assert [first[f"flow_lag{k}"] for k in range(7, 0, -1)] == [
        0.190,
        0.167,
        0.157,
        0.132,
        0.106,
        0.100,
        0.098,
    ]
    assert y[0] == (1.0 if flow[7] > flow[6] else -1.0)


def test_fisher_every_sample_uses_only_earlier_days(fisher_dir: Path) -> None:
    X, y, names = load_river_flow(fisher_dir, "fisher", scaled=False)
    flow = np.array(_values_by_hand(fisher_dir / "fisher.dat"))
    temperature = np.array(_values_by_hand(fisher_dir / "fishert.dat"))
    n = len(flow)
    assert n == 1461
    for k in range(1, 8):
        # Sample i predicts day i + 7; its lag k is day i + 7 - k.
        np.testing.assert_array_equal(X[:, names.index(f"flow_lag{k}")], flow[7 - k : n - k])
        np.testing.assert_array_equal(
            X[:, names.index(f"temperature_lag{k}")], temperature[7 - k : n - k]
        )
    np.testing.assert_array_equal(y, np.where(flow[7:] > flow[6:-1], 1.0, -1.0))
    # The label of day t is what flow_lag1 of the next sample shows against this one's.
    lag1 = X[:, names.index("flow_lag1")]
    np.testing.assert_array_equal(y[:-1], np.where(lag1[1:] > lag1[:-1], 1.0, -1.0))


def test_fisher_scaled_columns_span_zero_to_one(fisher_dir: Path) -> None:
    X, _, _ = load_river_flow(fisher_dir, "fisher")
    raw, _, _ = load_river_flow(fisher_dir, "fisher", scaled=False)
    np.testing.assert_array_equal(X.min(axis=0), 0.0)
    np.testing.assert_allclose(X.max(axis=0), 1.0)
    assert np.all((X >= 0.0) & (X <= 1.0))
    expected = (raw - raw.min(axis=0)) / (raw.max(axis=0) - raw.min(axis=0))
    np.testing.assert_allclose(X, expected)


def test_fisher_stream_matches_the_arrays(fisher_dir: Path) -> None:
    stream = RiverFlow(fisher_dir)
    assert isinstance(stream, base.Dataset)
    assert stream.task == base.BINARY_CLF
    assert (stream.n_samples, stream.n_features, stream.n_classes) == (1454, 21, 2)
    assert stream.feature_names == FISHER_NAMES
    X, y, names = stream.to_arrays()
    samples = list(stream)
    assert len(samples) == 1454
    for i in (0, 1, 700, 1453):
        x, label = samples[i]
        assert list(x) == names
        assert [x[name] for name in names] == X[i].tolist()
        assert type(label) is bool
        assert label == bool(y[i] > 0)
    assert sum(label for _, label in samples) == 563
    assert len(list(stream)) == 1454  # the stream can be iterated again
    assert "RiverFlow" in repr(stream)


def test_other_rivers_load(more_rivers_dir: Path) -> None:
    assert available_rivers(more_rivers_dir) == ["oldman", "saugeen"]
    expected = {"oldman": (1461, 555), "saugeen": (1400, 452)}
    for river, (n_days, n_rises) in expected.items():
        flow = read_daily_series(more_rivers_dir / f"{river}.dat")
        assert flow.shape == (n_days,)
        assert flow.tolist() == _values_by_hand(more_rivers_dir / f"{river}.dat")
        X, y, _ = load_river_flow(more_rivers_dir, river)
        assert X.shape == (n_days - 7, 21)
        assert int((y > 0).sum()) == n_rises
        assert X.min() == 0.0 and X.max() == 1.0
        assert RiverFlow(more_rivers_dir, river, lags=3).n_features == 9


def test_oldman_header_with_more_than_three_comment_lines(more_rivers_dir: Path) -> None:
    # oldmanp.dat has eight '#' lines (one of them bare), not three like the Fisher files.
    path = more_rivers_dir / "oldmanp.dat"
    assert sum(line.startswith("#") for line in path.read_text().splitlines()) == 8
    assert len(read_daily_series(path)) == 1461
    assert read_daily_series(path).tolist() == _values_by_hand(path)


# --- small files: exact layout ---------------------------------------------------------------


def test_toy_river_exact_layout(tmp_path: Path) -> None:
    temperature = [10.0, 11.0, 12.0, 13.0, 14.0]
    precipitation = [0.0, 1.0, 0.0, 2.0, 0.0]
    flow = [5.0, 6.0, 6.0, 4.0, 7.0]
    _write_river(tmp_path, temperature, precipitation, flow)
    X, y, names = load_river_flow(tmp_path, "toy", lags=2, scaled=False)
    assert names == [
        "temperature_lag1",
        "temperature_lag2",
        "precipitation_lag1",
        "precipitation_lag2",
        "flow_lag1",
        "flow_lag2",
    ]
    # Samples predict days 2, 3, 4: rows are (day t-1, day t-2) of each series.
    np.testing.assert_array_equal(
        X,
        [
            [11.0, 10.0, 1.0, 0.0, 6.0, 5.0],
            [12.0, 11.0, 0.0, 1.0, 6.0, 6.0],
            [13.0, 12.0, 2.0, 0.0, 4.0, 6.0],
        ],
    )
    # Day 2 is unchanged (6 -> 6), so it is not a rise.
    np.testing.assert_array_equal(y, [-1.0, -1.0, 1.0])
    assert list(RiverFlow(tmp_path, "toy", lags=2, scaled=False))[2] == (
        dict(zip(names, [13.0, 12.0, 2.0, 0.0, 4.0, 6.0], strict=True)),
        True,
    )


def test_toy_river_flow_target_is_the_days_flow(tmp_path: Path) -> None:
    _write_river(tmp_path, [10.0, 11.0, 12.0, 13.0, 14.0], [0.0, 1.0, 0.0, 2.0, 0.0],
                 [5.0, 6.0, 6.0, 4.0, 7.0])
    X, y, _ = load_river_flow(tmp_path, "toy", lags=2, scaled=True, target="flow")
    # The flows of days 2, 3, 4, unscaled, beside the same (scaled) features as the classes'.
    np.testing.assert_array_equal(y, [6.0, 4.0, 7.0])
    np.testing.assert_array_equal(X, load_river_flow(tmp_path, "toy", lags=2)[0])
    stream = RiverFlow(tmp_path, "toy", lags=2, target="flow")
    assert [target for _, target in stream] == [6.0, 4.0, 7.0]
    assert stream.task == "Regression"
    with pytest.raises(ValueError, match="target must be one of"):
        load_river_flow(tmp_path, "toy", lags=2, target="level")


def test_constant_column_scales_to_zero(tmp_path: Path) -> None:
    _write_river(tmp_path, [1.0, 2.0, 3.0, 5.0], [0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 1.0, 3.0])
    X, _, names = load_river_flow(tmp_path, "toy", lags=1)
    np.testing.assert_array_equal(X[:, names.index("precipitation_lag1")], 0.0)
    np.testing.assert_allclose(X[:, names.index("temperature_lag1")], [0.0, 0.5, 1.0])


def test_comment_lines_and_trailing_blank_lines_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "x.dat"
    path.write_text("Title\n#one\n#\n   #indented\n1.5\n-2\n 3e1 \r\n.5\n\n  \n")
    np.testing.assert_array_equal(read_daily_series(path), [1.5, -2.0, 30.0, 0.5])
    path.write_text("Title only, no comments\n7\n8\n")
    np.testing.assert_array_equal(read_daily_series(path), [7.0, 8.0])


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "bad_line", "words"),
    [
        (["Title", "#c", "1.0", "abc", "2.0"], 4, "'abc'"),
        (["Title", "#c", "1.0", "1.0 2.0"], 4, "'1.0 2.0'"),
        (["Title", "#c", "1.0", "nan"], 4, "'nan'"),
        (["Title", "#c", "1.0", "1e999"], 4, "not finite"),
        (["Title", "#c", "1.0", "", "2.0"], 4, "blank line"),
        (["Title", "#c", "1.0", "#late comment", "2.0"], 4, "comment"),
        (["1.0", "2.0"], 1, "title"),
        (["", "1.0"], 1, "title"),
    ],
)
def test_malformed_series_names_file_and_line(
    tmp_path: Path, lines: list[str], bad_line: int, words: str
) -> None:
    path = tmp_path / "bad.dat"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"title|number|finite|blank|comment") as info:
        read_daily_series(path)
    message = str(info.value)
    assert str(path) in message
    assert f"line {bad_line}:" in message
    assert words in message


def test_series_without_values_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.dat"
    path.write_text("Title\n# a\n# b\n\n")
    with pytest.raises(ValueError, match="no values"):
        read_daily_series(path)
    path.write_text("")
    with pytest.raises(ValueError, match="line 1"):
        read_daily_series(path)


def test_malformed_river_file_is_reported_through_the_loader(tmp_path: Path) -> None:
    _write_river(tmp_path, [1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [1.0, 2.0, 3.0])
    (tmp_path / "toyp.dat").write_text("Title\n#\n0.0\n0,5\n0.0\n")
    with pytest.raises(ValueError, match=r"toyp\.dat, line 4: expected one number"):
        load_river_flow(tmp_path, "toy", lags=1)


def test_missing_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nothing\.dat"):
        read_daily_series(tmp_path / "nothing.dat")
    with pytest.raises(FileNotFoundError, match="directory not found"):
        load_river_flow(tmp_path / "no-such-dir", "toy")

    _write_river(tmp_path, [1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [1.0, 2.0, 3.0])
    (tmp_path / "toyt.dat").unlink()
    with pytest.raises(FileNotFoundError, match=r"temperature series of river 'toy'.*toyt\.dat"):
        load_river_flow(tmp_path, "toy", lags=1)
    with pytest.raises(FileNotFoundError, match=r"river 'fisher' not found: .*fishert\.dat"):
        RiverFlow(tmp_path)


def test_unequal_lengths_are_reported(tmp_path: Path) -> None:
    _write_river(tmp_path, [1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match="different lengths") as info:
        load_river_flow(tmp_path, "toy", lags=1)
    assert "toyp.dat: 3" in str(info.value)
    assert "toyt.dat: 4" in str(info.value)


def test_bad_lags(tmp_path: Path) -> None:
    _write_river(tmp_path, [1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [1.0, 2.0, 3.0])
    for lags in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="lags must be a positive integer"):
            load_river_flow(tmp_path, "toy", lags=lags)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="has 3 days"):
        load_river_flow(tmp_path, "toy", lags=3)
    assert load_river_flow(tmp_path, "toy", lags=2)[0].shape == (1, 6)
    assert river_flow_feature_names(1) == ["temperature_lag1", "precipitation_lag1", "flow_lag1"]
