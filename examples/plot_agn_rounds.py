"""Plots held-out accuracy against gradient all-reduces (and epochs).

Reads the JSON records `bench/agn_rounds.py` writes (`bench/out/
agn_rounds.json`), or records of your own run in the same form:

```json
{"target": 0.93,
 "runs": [{"config": "DiLoCo p=16", "seed": 0,
           "records": [{"epoch": 1, "all_reduces": 5, "accuracy": 0.81},
                       ...]},
          ...]}
```

(`target`, optional, draws a horizontal line), and draws one curve per
configuration: the mean over its runs (seeds) per epoch, with their min-max
as a band; the x axis is the all-reduces so far (log scale) or the epochs.
To record a run of your own, read `optimizer.communication_rounds` and the
held-out accuracy of the global model (`assign_global_centers()`, then
restore the local weights) in a callback's `on_epoch_end`.

From Python, `plot_points({"synchronous": [(80, 0.90), (160, 0.93)],
"DiLoCo p=16": [(5, 0.88), (10, 0.92)]}, "acc.png")` plots plain lists of
(all-reduces, accuracy) per configuration.

Usage:
    python examples/plot_agn_rounds.py RECORDS.json [--output PNG]
                                       [--x all_reduces|epoch]
"""

import argparse
import json

# Line styles of configurations whose names contain these words.
LINESTYLES = {"DiLoCo": "--", "averaging": "-.", "float16": ":"}
SIZE, DPI = (7.5, 4.8), 110  # The figure's inches and dots per inch.


def curves_from_runs(runs):
    """{config: {"epoch", "all_reduces", "mean", "low", "high": lists}},
    over the epochs every run of the configuration has."""
    by_config = {}
    for run in runs:
        by_config.setdefault(run["config"], []).append(run["records"])
    curves = {}
    for config, seeds in by_config.items():
        epochs = min(len(records) for records in seeds)
        curve = {key: [] for key in ("epoch", "all_reduces", "mean")}
        curve.update(low=[], high=[])
        for i in range(epochs):
            accuracies = [records[i]["accuracy"] for records in seeds]
            curve["epoch"].append(seeds[0][i]["epoch"])
            curve["all_reduces"].append(seeds[0][i]["all_reduces"])
            curve["mean"].append(sum(accuracies) / len(accuracies))
            curve["low"].append(min(accuracies))
            curve["high"].append(max(accuracies))
        curves[config] = curve
    return curves


def plot_points(points, path, target=None):
    """Plots {config: [(all-reduces, accuracy), ...]} (one per epoch)."""
    runs = [
        {
            "config": config,
            "records": [
                {"epoch": i + 1, "all_reduces": rounds, "accuracy": accuracy}
                for i, (rounds, accuracy) in enumerate(pairs)
            ],
        }
        for config, pairs in points.items()
    ]
    plot(curves_from_runs(runs), path, target=target)


def plot(curves, path, x="all_reduces", target=None, title=None):
    """Saves accuracy against `x` ("all_reduces", log scale, or "epoch")."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=SIZE)
    draw(axes, curves, x, target, title)
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    plt.close(figure)


def draw(axes, curves, x="all_reduces", target=None, title=None):
    """Draws `plot`'s curves on the matplotlib `axes`."""
    for config, curve in curves.items():
        xs = curve[x]
        if x == "all_reduces":  # A log axis has no 0.
            kept = [i for i, value in enumerate(xs) if value > 0]
        else:
            kept = range(len(xs))
        xs = [xs[i] for i in kept]
        style = {"marker": ".", "linewidth": 1.2}
        for word, linestyle in LINESTYLES.items():
            if word in config:
                style["linestyle"] = linestyle
        if config.startswith("synchronous"):
            style.update(color="black", linewidth=2.0, zorder=3)
        (line,) = axes.plot(
            xs, [curve["mean"][i] for i in kept], label=config, **style
        )
        axes.fill_between(
            xs,
            [curve["low"][i] for i in kept],
            [curve["high"][i] for i in kept],
            color=line.get_color(),
            alpha=0.15,
            linewidth=0,
        )
    if target is not None:
        axes.axhline(
            target,
            color="gray",
            linestyle="--",
            linewidth=1,
            label=f"target {target:.3f}",
        )
    if x == "all_reduces":
        axes.set_xscale("log")
        axes.set_xlabel("gradient all-reduces (communication rounds)")
    else:
        axes.set_xlabel("epoch")
    axes.set_ylabel("held-out accuracy of the global model")
    # Down to the lowest mean, but not far below the lowest final one.
    lowest = min(min(c["mean"]) for c in curves.values())
    lowest_final = min(c["mean"][-1] for c in curves.values())
    axes.set_ylim(max(0.0, max(lowest, lowest_final - 0.15) - 0.01), 1.0)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7, loc="lower right")
    if title:
        axes.set_title(title, fontsize=9)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", help="JSON records (see above)")
    parser.add_argument(
        "--output",
        default="agn_rounds.png",
        help="the PNG to write (default agn_rounds.png)",
    )
    parser.add_argument(
        "--x",
        choices=["all_reduces", "epoch"],
        default="all_reduces",
        help="the x axis (default all_reduces, log scale)",
    )
    args = parser.parse_args(argv)
    with open(args.records) as f:
        data = json.load(f)
    plot(
        curves_from_runs(data["runs"]),
        args.output,
        x=args.x,
        target=data.get("target"),
    )
    print(f"Wrote {args.output}.")


if __name__ == "__main__":
    main()
