"""A predictor's refresh against the length of the state topic's history, on the embedded
broker (which never compacts: every state published stays in the topic).

    .venv/bin/python benchmarks/bench_state_follow.py [--states 200] [--megabytes 1]

A writer publishes ``--states`` states of one model (``--megabytes`` of float64 each) on a
fresh state topic. After every publish a reader follows the topic as a predictor does
(:meth:`connectors.state_store.StateStore.follow`: only the records written since its last
read); at a few points a second reader reads the whole topic (``restore``), as predictors did
before, and the follower reads once more with nothing new. Prints a markdown table and writes
it to ``benchmarks/out/state_follow.md``.
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np
from _common import emit, machine_info, markdown_table

from connectors.broker import EmbeddedBroker
from connectors.state_store import StateStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=200)
    parser.add_argument("--megabytes", type=float, default=1.0)
    args = parser.parse_args()
    arrays = {"alpha": np.random.default_rng(0).standard_normal(int(args.megabytes * 125_000))}
    marks = sorted({1, 10, args.states // 4, args.states // 2, args.states} - {0})
    rows = []
    with EmbeddedBroker() as broker:
        servers = broker.bootstrap_servers
        writer = StateStore(servers, "state", timeout=30)
        whole = StateStore(servers, "state", timeout=300)
        follower = StateStore(servers, "state", timeout=60)
        try:
            writer.ensure_topic()
            newest = None
            for sequence in range(1, args.states + 1):
                writer.publish("m", arrays, {}, next_offset=sequence, epoch=0,
                               sequence=sequence)
                started = time.perf_counter()
                state = follower.follow("m", newer_than=newest)
                after_publish = time.perf_counter() - started
                assert state is not None and state.sequence == sequence
                newest = (state.epoch, state.sequence)
                if sequence not in marks:
                    continue
                started = time.perf_counter()
                restored = whole.restore(["m"], log_level=logging.DEBUG)["m"]
                whole_read = time.perf_counter() - started
                assert restored.sequence == sequence
                started = time.perf_counter()
                assert follower.follow("m", newer_than=newest) is None
                nothing_new = time.perf_counter() - started
                rows.append([sequence, whole.last_report.records, round(whole_read * 1e3),
                             round(after_publish * 1e3), round(nothing_new * 1e3, 1)])
                print(rows[-1], flush=True)
        finally:
            for store in (writer, whole, follower):
                store.close()
    emit("state_follow", "\n\n".join([
        f"States of {args.megabytes:g} MB published on one topic, embedded broker; ms per read.",
        markdown_table(["states published", "records in the topic", "whole-topic read (ms)",
                        "follow after one publish (ms)", "follow, nothing new (ms)"], rows),
        machine_info(),
    ]))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
