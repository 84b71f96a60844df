"""Architecture diagram of a scaled-out stream-svm deployment on Kafka.

Draws, with matplotlib only: an input topic with six partitions (plus a co-partitioned label
topic) consumed by one consumer group of three ``stream-svm`` daemons, each holding one model
per (partition, key); their output and dead-letter topics; the compacted state topic the
daemons publish to and restore from; and optional predictor replicas that read that state.
Saves ``benchmarks/figures/scale_out.png``. Run from the repository root:

    .venv/bin/python benchmarks/figure_scale_out.py
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

OUT = Path(__file__).resolve().parent / "figures" / "scale_out.png"

# Colours: Kafka topics blue/green/red/purple, daemons orange, models white.
TOPIC, OUTPUT, DEAD, STATE = "#dbe9f6", "#dcefd9", "#f8dcdc", "#e8e0f3"
DAEMON, PREDICTOR = "#fdebd3", "#eeeeee"
PUBLISH, RESTORE, DATA = "#5b3f8c", "#2e7d32", "#555555"


def box(ax: Axes, x: float, y: float, w: float, h: float, fc: str = "white",
        ec: str = "#333333", ls: str = "-", lw: float = 1.0) -> None:
    """A rounded rectangle with lower-left corner (x, y) in figure units (0.1 inch)."""
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.8",
                                fc=fc, ec=ec, ls=ls, lw=lw, zorder=2))


def text(ax: Axes, x: float, y: float, s: str, size: float = 9, **kwargs: object) -> None:
    ax.text(x, y, s, fontsize=size, ha=kwargs.pop("ha", "center"),
            va=kwargs.pop("va", "center"), zorder=5, **kwargs)


def arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], color: str = DATA,
          ls: str = "-", lw: float = 1.1, head: bool = True) -> None:
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>" if head else "-",
                                 mutation_scale=10, color=color, ls=ls, lw=lw,
                                 shrinkA=0, shrinkB=0, zorder=3))


def draw() -> plt.Figure:
    fig = plt.figure(figsize=(11, 8.6), facecolor="white")
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 110)
    ax.set_ylim(0, 86)
    ax.set_axis_off()
    text(ax, 55, 83.5, "Scaling out stream-svm: one consumer group, one model per "
         "(partition, key), state in a compacted topic", size=11, weight="bold")

    # Left: input topic with six partition lanes, and the label topic beneath it.
    box(ax, 2, 40.5, 18, 36, fc=TOPIC)
    text(ax, 11, 74, "input topic", size=10, weight="bold")
    text(ax, 11, 70.8, "key = gauge / customer", size=8.5, style="italic")
    lanes: list[float] = []
    for k in range(6):
        top = 68 - 4.4 * k
        box(ax, 3.5, top - 3.5, 15, 3.5, lw=0.8)
        text(ax, 5.6, top - 1.75, f"p{k}", size=9)
        for m in range(4):
            ax.add_patch(plt.Rectangle((8.5 + 2.3 * m, top - 2.6), 1.6, 1.7, fc="#9ec3e6",
                                       ec="none", zorder=4))
        lanes.append(top - 1.75)
    box(ax, 3, 25, 16, 8, fc=TOPIC)
    text(ax, 11, 30.6, "label topic", size=9.5, weight="bold")
    text(ax, 11, 27.4, "(co-partitioned)", size=8.5)
    text(ax, 11, 20.5, "labels of p$i$ reach the\ndaemon that owns p$i$", size=8,
         color=DATA)
    arrow(ax, (19, 29), (25, 29), ls="--")

    # Middle: the consumer group with three daemons, two partitions each.
    box(ax, 25, 22, 56, 57.5, fc="none", ec="#444444", ls="--", lw=1.2)
    text(ax, 27, 77.3, "consumer group  group_id", size=10, weight="bold", ha="left")
    daemons = [(60.5, 0), (44.5, 2), (28.5, 4)]  # (bottom y, first partition)
    for number, (y0, p) in enumerate(daemons, start=1):
        box(ax, 28, y0, 44, 14, fc=DAEMON)
        text(ax, 29.5, y0 + 11.6, f"stream-svm daemon {number}", size=9.5, weight="bold",
             ha="left")
        text(ax, 70.5, y0 + 11.6, f"partitions p{p}, p{p + 1}", size=8.5, ha="right")
        for i, label in enumerate((f"p{p}, key a", f"p{p}, key b", f"p{p + 1}, key a")):
            box(ax, 29.5 + 13 * i, y0 + 2, 12, 6.5, lw=0.8)
            text(ax, 35.5 + 13 * i, y0 + 5.25, f"model\n({label})", size=8)
        text(ax, 69.5, y0 + 5.25, "...", size=10)
        arrow(ax, (20, lanes[p]), (28, y0 + 9.5))
        arrow(ax, (20, lanes[p + 1]), (28, y0 + 6.5))
    text(ax, 50, 25.2, "model.scope = partition | key;  at most model.max_models live (LRU)",
         size=8.5, style="italic")

    # Right: output and dead-letter topics, fed by every daemon.
    box(ax, 84, 55, 18, 9, fc=OUTPUT)
    text(ax, 93, 61, "output topic", size=10, weight="bold")
    text(ax, 93, 57.6, "predictions", size=8.5)
    box(ax, 84, 36, 18, 9, fc=DEAD)
    text(ax, 93, 42, "dead-letter topic", size=10, weight="bold")
    text(ax, 93, 38.6, "records that failed", size=8.5)
    for i, (y0, _) in enumerate(daemons):
        arrow(ax, (72, y0 + 11), (84, 61.5 - 2 * i))
        arrow(ax, (72, y0 + 8.5), (84, 43 - 2 * i))

    # Bottom: the compacted state topic, with a publish bus and a restore bus.
    box(ax, 24, 5.5, 84, 10, fc=STATE)
    text(ax, 66, 12.6, "state topic   <group_id>.state   (compacted)", size=10,
         weight="bold")
    text(ax, 66, 8.6, "one record per model (partition, key): .npz chunks, next offset, "
         "epoch (fences zombies)", size=9)
    x_pub, x_res = 75, 78.5
    for y0, _ in daemons:
        arrow(ax, (72, y0 + 4), (x_pub, y0 + 4), color=PUBLISH, head=False, lw=1.4)
        arrow(ax, (x_res, y0 + 1.5), (72, y0 + 1.5), color=RESTORE, lw=1.4)
    arrow(ax, (x_pub, daemons[0][0] + 4), (x_pub, 15.5), color=PUBLISH, lw=1.4)
    arrow(ax, (x_res, 15.5), (x_res, daemons[0][0] + 1.5), color=RESTORE, head=False, lw=1.4)
    text(ax, 74, 18.7, "publish state every checkpoint / on revocation", size=8.5,
         color=PUBLISH, ha="right")
    text(ax, 79.5, 18.7, "restore on assignment", size=8.5, color=RESTORE, ha="left")

    # Top right: predictor replicas reading the newest state of a global model.
    box(ax, 82, 69, 22, 10, fc=PREDICTOR, ls="--")
    text(ax, 93, 75.6, "predictor replicas", size=9.5, weight="bold")
    text(ax, 93, 72.2, "(daemon.role = predictor)", size=8.5)
    arrow(ax, (106, 15.5), (106, 74), color=PUBLISH, ls="--", head=False)
    arrow(ax, (106, 74), (104, 74), color=PUBLISH, ls="--")
    text(ax, 108, 42, "newest state (global model)", size=8.5, color=PUBLISH, rotation=90)

    text(ax, 55, 2, "A killed daemon's partitions move to the others; they restore its "
         "models from the state topic and resume at the committed offsets.", size=9,
         style="italic")
    return fig


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig = draw()
    fig.savefig(OUT, dpi=150, facecolor="white")
    plt.close(fig)
    print(OUT)


if __name__ == "__main__":
    main()
