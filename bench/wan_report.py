"""The analysis, tables and figures of `bench/wan.py`, and the parts of
them that `bench/overlap.py` and `bench/wan_jax.py` share.

Standard library only, but for matplotlib in the figures: the workers use
the analysis to choose configurations, the drivers (no TensorFlow) print
the report.
"""

import dataclasses
import itertools
import math
import os
import statistics

import agn_rounds
import harness
import launching
import mnist_mlp
import netns

cost_model = launching.package_module("cost_model")

SYNC = agn_rounds.config_name("sync", 1)
POINTS_BELOW = 0.005  # The target: synchronous training's final mean less.
PREDICTION_TOLERANCE = 0.25
END_TO_END_TOLERANCE = 0.15
GOAL = 10.0  # Speed-up over synchronous training at 100 Mbit/s.
GOAL_LINK = "100mbit"
# The unshaped loopback's rate, for the figure's axis only (measured on
# the bench machine as about 20 Gbit/s); the cost model treats it as free.
UNSHAPED_BITS = 20e9
EXTRAPOLATION_WORKERS = (8, 64)
EXTRAPOLATION_BANDWIDTHS = (1e9, 10e9)
LARGE_MODEL_BYTES = 100e6


# Planning the timed runs.


def block_steps(period, steps_per_epoch):
    """The fewest steps that hold whole periods and whole executions."""
    return math.lcm(period, steps_per_epoch)


def plan_epochs(period, steps_per_epoch, plan):
    """Epochs per link and repeat: whole blocks, enough for the plan's
    periods per cell (synchronous training: steps) over its repeats."""
    if period == 1:
        steps = plan["sync_steps_per_cell"]
    else:
        steps = plan["periods_per_cell"] * period
    per_repeat = math.ceil(steps / plan["repeats"])
    block = block_steps(period, steps_per_epoch)
    return math.ceil(per_repeat / block) * block // steps_per_epoch


# Steps to target.


def reach(curve, target):
    """The first point of `curve` whose mean reaches `target`, or None."""
    return next((p for p in curve if p["mean"] >= target - 1e-12), None)


def mean_curve(runs):
    """Per epoch of one configuration's `runs` (its seeds): the epoch,
    steps, all-reduces and the accuracy's mean, min and max."""
    curve = []
    for records in zip(*(run["records"] for run in runs)):
        accuracies = [r["accuracy"] for r in records]
        first = records[0]
        curve.append(
            {
                "epoch": first["epoch"],
                "steps": first["steps"],
                "all_reduces": first["all_reduces"],
                "mean": sum(accuracies) / len(accuracies),
                "low": min(accuracies),
                "high": max(accuracies),
            }
        )
    return curve


def analyse_steps(runs):
    """The targets and, per configuration, its curve and what it needs to
    reach each target (its seeds' mean, and seed 0 alone)."""
    configs = agn_rounds.by_config(runs)
    sync_runs = configs[SYNC]
    final_epoch = min(len(r["records"]) for r in sync_runs)
    final = [r["records"][final_epoch - 1]["accuracy"] for r in sync_runs]
    target = statistics.mean(final) - POINTS_BELOW
    strict = min(final)
    curves, rows = {}, {}
    for name, config_runs in configs.items():
        curve = curves[name] = mean_curve(config_runs)
        first = config_runs[0]
        seed_0 = next(r for r in config_runs if r["seed"] == 0)
        rows[name] = {
            "config": name,
            "key": (
                first["rule"],
                first["period"],
                first["communication_dtype"],
            ),
            "period": first["period"],
            "communication_dtype": first["communication_dtype"],
            "seeds": len(config_runs),
            "bytes_per_round": first["bytes_per_round"],
            "final": curve[-1],
            "target": reach(curve, target),
            "strict": reach(curve, strict),
            "seed_0": reach(mean_curve([seed_0]), target),
            "seed_0_records": seed_0["records"],
        }
    return {"target": target, "strict": strict, "curves": curves, "rows": rows}


def _local_rows(steps):
    return [r for r in steps["rows"].values() if r["period"] > 1]


def best_for_16_bits(steps):
    """`(rule, period, None)` of the 32-bit local-step configuration with
    the fewest all-reduces to the target, then the fewest steps, then the
    highest final accuracy."""

    def key(row):
        point = row["target"] or {"all_reduces": math.inf, "steps": math.inf}
        return (point["all_reduces"], point["steps"], -row["final"]["mean"])

    rows = [r for r in _local_rows(steps) if r["communication_dtype"] is None]
    return tuple(min(rows, key=key)["key"])


def step_factor(steps, name):
    """A configuration's steps to the target over synchronous training's."""
    sync, point = steps["rows"][SYNC]["target"], steps["rows"][name]["target"]
    if sync is None or point is None:
        return None
    return point["steps"] / sync["steps"]


# Time per step.


def configs_to_time(steps, configs):
    """Of `configs` (`(rule, period, dtype)`, synchronous training first),
    synchronous training and those that reach the target; the first
    local-step one if none does (a quick run)."""
    reached = {tuple(r["key"]) for r in steps["rows"].values() if r["target"]}
    chosen = [configs[0]] + [c for c in configs[1:] if c in reached]
    return chosen if len(chosen) > 1 else configs[:2]


def time_cells(timings):
    """Per `(configuration, link)`: seconds per step, the median over
    blocks of whole periods and executions, and the blocks' range."""
    cells = {}
    for timing in timings:
        per_link = {}
        for link, seconds in timing["epochs"]:
            per_link.setdefault(link, []).append(seconds)
        size = timing["block_epochs"]
        steps = size * timing["steps_per_epoch"]
        for link, epochs in per_link.items():
            blocks = [
                sum(epochs[i : i + size]) / steps
                for i in range(0, len(epochs) - size + 1, size)
            ]
            cells[timing["config"], link] = {
                "median": statistics.median(blocks),
                "low": min(blocks),
                "high": max(blocks),
                "steps": len(epochs) * timing["steps_per_epoch"],
            }
    return cells


def fastest_local(steps, cells, link):
    """`(rule, period, dtype)` of the local-step configuration with the
    shortest time to the target on `link` (steps x seconds per step); the
    first local one if none reaches the target (a quick run)."""
    reached = [r for r in _local_rows(steps) if r["target"] is not None]
    if not reached:
        return tuple(_local_rows(steps)[0]["key"])

    def seconds(row):
        return row["target"]["steps"] * cells[row["config"], link]["median"]

    return tuple(min(reached, key=seconds)["key"])


# The cost model.


def configured(cost, timing):
    """`cost` (fitted on float32 rounds) for `timing`'s configuration: its
    bytes per round, against synchronous training in float32 (`cost`'s
    bytes)."""
    return dataclasses.replace(
        cost,
        model_bytes=timing["bytes_per_round"],
        synchronous_bytes=cost.model_bytes,
    )


def predicted(cost, timing, link, meta):
    """The cost model's seconds per step for `timing`'s configuration on
    `link`, a token bucket whose burst refills between rounds."""
    config_cost = configured(cost, timing)
    link = netns.LINKS[link]
    return config_cost.step_seconds(
        timing["period"],
        link.bits_per_second,
        meta["steps_per_execution"],
        burst_bytes=0.0 if link.rate is None else link.burst_bytes,
    )


def crossing(points):
    """Where speed-ups `(bandwidth, speed_up)` cross 1, interpolated in
    log-log; None if they never do."""
    points = sorted(points)
    for (b0, s0), (b1, s1) in zip(points, points[1:]):
        if (s0 - 1) * (s1 - 1) <= 0 and s0 != s1:
            t = math.log(s0) / (math.log(s0) - math.log(s1))
            return math.exp(math.log(b0) + t * (math.log(b1) - math.log(b0)))
    return None


# The report.


def _ms(seconds):
    return f"{1e3 * seconds:.1f}"


def _bandwidth(bits):
    return "-" if bits is None else cost_model.format_bandwidth(bits)


def _text(value, form):
    """`value` formatted by `form`, "-" when None."""
    return "-" if value is None else form.format(value)


def _reach_text(point):
    if point is None:
        return "not reached"
    return f"{point['steps']:,} ({point['epoch']}), {point['all_reduces']:,}"


def steps_table(steps):
    rows = []
    for name, row in steps["rows"].items():
        final = row["final"]
        factor = "-"
        if row["target"] and steps["rows"][SYNC]["target"]:
            factor = f"{step_factor(steps, name):.2f}"
        spread = f"{final['low']:.4f}-{final['high']:.4f}"
        rows.append([name, row["seeds"], f"{final['mean']:.4f} ({spread})"])
        rows[-1] += [final["epoch"], _reach_text(row["target"]), factor]
        rows[-1].append(_reach_text(row["strict"]))
    target, strict = steps["target"], steps["strict"]
    return harness.table(
        ["config", "seeds", "final accuracy, mean (min-max)", "epochs"]
        + [f"to target {target:.4f}: steps (epoch), all-reduces"]
        + ["steps vs synchronous"]
        + [f"to strict target {strict:.4f}: steps (epoch), all-reduces"],
        rows,
        align="lrlrrrr",
    )


def time_rows(steps, timings, cells, cost, meta):
    """Per link and configuration: measured and predicted seconds per
    step, time to target, speed-up over synchronous training, and the
    time table's row (`"text"`)."""
    rows = []
    sync_point = steps["rows"][SYNC]["target"]
    for link in meta["links"]:
        sync_time = None
        if sync_point is not None:
            sync_time = sync_point["steps"] * cells[SYNC, link]["median"]
        for timing in timings:
            name = timing["config"]
            cell, row = cells[name, link], steps["rows"][name]
            point = row["target"]
            to_target = point and point["steps"] * cell["median"]
            speed_up = None
            if to_target is not None and sync_time is not None:
                speed_up = sync_time / to_target
            guess = predicted(cost, timing, link, meta)
            error = guess / cell["median"] - 1
            measured = f"{_ms(cell['median'])} ({_ms(cell['low'])}-"
            text = [netns.LINKS[link].name, name, measured]
            text[-1] += f"{_ms(cell['high'])})"
            text += [f"{_ms(guess)} ({100 * error:+.0f}%)"]
            text += [point and f"{point['steps']:,}" or "not reached"]
            text += [_text(to_target, "{:.1f}"), _text(speed_up, "{:.1f}x")]
            text += [f"{row['final']['mean']:.4f}"]
            rows.append(
                {
                    "link": link,
                    "config": name,
                    "period": timing["period"],
                    "median": cell["median"],
                    "error": error,
                    "speed_up": speed_up,
                    "text": text,
                }
            )
    return rows


def time_table(rows):
    return harness.table(
        ["link", "config", "ms/step, median (min-max)", "predicted (error)"]
        + ["steps to target", "time to target, s", "speed-up vs synchronous"]
        + ["final accuracy"],
        [row["text"] for row in rows],
        align="llrrrrrr",
    )


def end_to_end_table(data, steps, cells):
    """Each end-to-end run against steps to target x ms per step."""
    rows = []
    for run in data["end_to_end"]:
        row = steps["rows"][run["config"]]
        seed_0, seconds = row["seed_0"], run["seconds"]
        median = cells[run["config"], run["link"]]["median"]
        product = seed_0 and seed_0["steps"] * median
        accuracies = [r["accuracy"] for r in run["records"]]
        same = accuracies == [
            r["accuracy"] for r in row["seed_0_records"][: len(accuracies)]
        ]
        ratio, within = "-", "-"
        if product is not None and seconds is not None:
            ratio = f"{seconds / product:.2f}"
            close = abs(seconds / product - 1) <= END_TO_END_TOLERANCE
            within = "yes" if close else "NO"
        rows.append(
            [run["config"], netns.LINKS[run["link"]].name]
            + [run["reached_epoch"] or "not reached"]
            + [_text(seconds, "{:.1f}"), _text(product, "{:.1f}"), ratio]
            + [within, "yes" if same else "NO"]
        )
    return harness.table(
        ["config", "link", "epoch reached (seed 0)", "wall-clock to target, s"]
        + ["steps x ms/step, s", "measured / product", "within 15%"]
        + ["accuracies equal the steps-to-target run"],
        rows,
        align="llrrrrll",
    )


def break_even_table(steps, timings, rows, cost, meta):
    lines = []
    for timing in timings:
        name = timing["config"]
        factor = step_factor(steps, name)
        if timing["period"] == 1 or factor is None:
            continue
        model = configured(cost, timing)
        even = model.break_even_bandwidth(
            timing["period"], factor, meta["steps_per_execution"]
        )
        speed_ups = ", ".join(
            f"{r['link']}: {r['speed_up']:.1f}"
            for r in rows
            if r["config"] == name and r["speed_up"] is not None
        )
        lines.append([name, f"{factor:.2f}", speed_ups])
        lines[-1] += [measured_break_even(rows, name), _bandwidth(even)]
    return harness.table(
        ["config", "step factor", "measured speed-ups (link: x)"]
        + ["break-even bandwidth, measured", "cost model"],
        lines,
        align="lrlrr",
    )


def measured_break_even(rows, name):
    """Where configuration `name`'s measured speed-ups cross 1, between
    shaped links (the unshaped link's rate is not known)."""
    mine = [r for r in rows if r["config"] == name and r["speed_up"]]
    shaped = [
        (netns.LINKS[r["link"]].bits_per_second, r["speed_up"])
        for r in mine
        if netns.LINKS[r["link"]].rate is not None
    ]
    crossed = crossing(shaped)
    if crossed is not None:
        return _bandwidth(crossed)
    if all(s > 1 for _, s in shaped):
        if all(r["speed_up"] > 1 for r in mine if r["link"] == "unshaped"):
            return "above every link: faster on all, unshaped too"
        return "between the fastest shaped link and the unshaped one"
    return "below every link"


def extrapolation_table(cost, period, factor, large_compute, execution):
    """AGN at `period` needing `factor` times the steps, against
    synchronous training, for more workers on faster links (each worker
    its own network card), with the ring's per-hop overhead as fitted here
    and without any (bandwidth alone)."""
    mlp = f"{mnist_mlp.NAME} ({cost.model_bytes / 1e6:.2f} MB)"
    compute, large = cost.compute_seconds, large_compute / 1e3
    models = (
        (f"{mlp}, compute {_ms(compute)} ms", cost.model_bytes, compute),
        (f"100 MB, compute {large_compute:g} ms", LARGE_MODEL_BYTES, large),
    )
    rows = []
    for (
        label,
        model_bytes,
        seconds,
    ), hop, workers, bandwidth in itertools.product(
        models,
        (cost.hop_seconds, 0.0),
        EXTRAPOLATION_WORKERS,
        EXTRAPOLATION_BANDWIDTHS,
    ):
        model = dataclasses.replace(
            cost,
            compute_seconds=seconds,
            hop_seconds=hop,
            model_bytes=model_bytes,
            workers=workers,
            shared_link=False,
        )
        rows.append(
            [label, f"{_ms(hop)} ms", workers, _bandwidth(bandwidth)]
            + _extrapolated(model, period, bandwidth, factor, execution)
        )
    return harness.table(
        ["model", "hop overhead", "workers", "link (per worker)"]
        + ["synchronous ms/step", f"AGN p={period} ms/step", "speed-up"]
        + ["break-even period", f"AGN p={period} wins below"],
        rows,
        align="lrrlrrrrr",
    )


def _extrapolated(model, period, bandwidth, factor, execution):
    """The table's cells that `model` predicts (`execution`: steps per
    execution)."""
    even = model.break_even_period(bandwidth, factor, execution)
    below = model.break_even_bandwidth(period, factor, execution)
    speed_up = model.speed_up(period, bandwidth, factor, execution)
    return [
        _ms(model.step_seconds(1, bandwidth, execution)),
        _ms(model.step_seconds(period, bandwidth, execution)),
        f"{speed_up:.1f}x",
        even or "none",
        _bandwidth(below),
    ]


def goal_line(rows):
    """Whether some AGN configuration reaches the target `GOAL` times
    sooner than synchronous training on `GOAL_LINK`."""
    link = netns.LINKS[GOAL_LINK].name
    if not any(r["link"] == GOAL_LINK for r in rows):
        return f"\nGoal (at {link}): not measured (no shaped links)."
    local = [
        r
        for r in rows
        if r["link"] == GOAL_LINK and r["period"] > 1 and r["speed_up"]
    ]
    if not local:
        return f"\nGoal (at {link}): no AGN configuration reached the target."
    best = max(local, key=lambda r: r["speed_up"])
    verdict = "met" if best["speed_up"] >= GOAL else "MISSED"
    return (
        f"\nGoal (at {link}, some AGN configuration at least {GOAL:g}x "
        f"sooner to the target than synchronous training): {best['config']}, "
        f"{best['speed_up']:.1f}x: {verdict}."
    )


def report(data, args):
    """Prints the tables and draws the figures of a run's records."""
    meta, timings = data["meta"], data["timings"]
    steps = analyse_steps(data["runs"])
    cells = time_cells(timings)
    execution = meta["steps_per_execution"]
    # Fitted on the unshaped link, where the bandwidth costs next to nothing.
    cost = cost_model.fit_step_cost(
        [
            (t["period"], execution, cells[t["config"], "unshaped"]["median"])
            for t in timings
            if t["communication_dtype"] is None
        ],
        timings[0]["bytes_per_round"],
        agn_rounds.WORKERS,
    )
    rows = time_rows(steps, timings, cells, cost, meta)
    print(
        f"\nTensorFlow {meta['tensorflow']}, Keras {meta['keras']}; "
        f"{agn_rounds.WORKERS} workers; wall time {meta['wall_s']:.0f} s "
        f"(training {meta['seconds']:.0f} s). {meta['train_size']:,} "
        f"training and {meta['held_out_size']:,} held-out digits, global "
        f"batch {meta['global_batch']}, steps_per_execution {execution}; "
        "learning rates "
        + ", ".join(f"{rule} {lr:g}" for rule, lr in meta["lr"].items())
        + "."
    )
    if not meta["shaped"]:
        print("No shaped link: the unshaped loopback only (no root).")
    for link in meta["links"]:
        print(f"Link {netns.LINKS[link].describe()}.")
    print(
        f"\nSteps to target (unshaped link; steps are each worker's local "
        f"steps). Target {steps['target']:.4f}: synchronous training's "
        f"final mean less {100 * POINTS_BELOW:g} points.\n"
    )
    print(steps_table(steps))
    print(
        f"Time per step and to target (seed 0 timed; whole periods, "
        f"{meta['plan']['repeats']} repeats interleaved). Predicted: the "
        f"cost model fitted on the unshaped link: "
        f"compute {_ms(cost.compute_seconds)} ms per step, "
        f"{_ms(cost.hop_seconds)} ms per ring step "
        f"({_ms(cost.collective_overhead)} ms per collective).\n"
    )
    print(time_table(rows))
    worst = max(abs(r["error"]) for r in rows)
    print(
        f"Largest prediction error: {100 * worst:.0f}% "
        f"({'within' if worst <= PREDICTION_TOLERANCE else 'NOT within'} "
        f"{100 * PREDICTION_TOLERANCE:.0f}%)."
    )
    print("\nEnd to end (seed 0; evaluation left out of the clock):\n")
    print(end_to_end_table(data, steps, cells))
    print("Break-even: AGN is faster to the target below this bandwidth.\n")
    print(break_even_table(steps, timings, rows, cost, meta), end="")
    print(goal_line(rows))
    # The 32-bit variant of the configuration run end to end.
    rule, period, _ = steps["rows"][data["end_to_end"][-1]["config"]]["key"]
    fastest = steps["rows"][agn_rounds.config_name(rule, period)]
    factor = step_factor(steps, fastest["config"])
    if factor is not None:
        print(
            f"\nExtrapolated by the cost model (not measured): "
            f"{fastest['config']}'s bytes per round, "
            f"period ({period}) and step factor ({factor:.2f}), each worker "
            f"with a network card of its own; the ring's per-hop overhead "
            f"as fitted here ({_ms(cost.hop_seconds)} ms: gRPC collectives "
            f"of worker processes sharing 2 cores, likely far more than on a "
            f"cluster) and none (bandwidth alone).\n"
        )
        model = dataclasses.replace(
            cost, model_bytes=fastest["bytes_per_round"]
        )
        large = args.large_model_compute_ms
        print(extrapolation_table(model, period, factor, large, execution))
    seconds = {(r["config"], r["link"]): r["median"] for r in rows}
    name = "wan_quantized" if getattr(args, "quantized", False) else "wan"
    accuracy_figure(
        os.path.join(args.figures, f"{name}_accuracy.png"),
        steps,
        seconds,
        meta["links"],
        "held-out accuracy, mean of seeds",
        "training seconds (steps x ms/step)",
    )
    speed_up_figure(
        data, steps, rows, cost, os.path.join(args.figures, f"{name}_")
    )


def accuracy_figure(path, steps, seconds, links, ylabel, xlabel):
    """Held-out accuracy (the mean of the seeds) against training seconds,
    steps x `seconds[config, link]`, one panel per link."""

    def draw(fig, axes):
        axes = list(getattr(axes, "flat", [axes]))
        for ax, link in zip(axes, links):
            for name, curve in steps["curves"].items():
                if (name, link) in seconds:  # Timed.
                    per_step = seconds[name, link]
                    x = [p["steps"] * per_step for p in curve]
                    ax.plot(x, [p["mean"] for p in curve], label=name)
            ax.axhline(steps["target"], color="grey", linestyle="--")
            ax.set(xscale="log", ylim=(0.85, 0.96), xlabel=xlabel)
            ax.set_title(netns.LINKS[link].name)
        axes[0].set_ylabel(ylabel)
        axes[-1].legend(fontsize=7, loc="lower right")

    harness.figure(path, draw, (1, len(links)), (4.5 * len(links), 4))


def speed_up_figure(data, steps, rows, cost, prefix):
    """`<prefix>speed_up.png`: speed-up against bandwidth, measured and
    modelled, the break-even marked."""
    execution = data["meta"]["steps_per_execution"]
    grid = [10 ** (6 + i / 20) for i in range(0, 91)]

    def draw(fig, ax):
        for timing in data["timings"]:
            name, period = timing["config"], timing["period"]
            factor = step_factor(steps, name)
            if period == 1 or factor is None:
                continue
            model = configured(cost, timing)
            modelled = [
                model.speed_up(period, b, factor, execution) for b in grid
            ]
            color = ax.plot(grid, modelled, linewidth=1)[0].get_color()
            measured = [
                (
                    netns.LINKS[r["link"]].bits_per_second or UNSHAPED_BITS,
                    r["speed_up"],
                )
                for r in rows
                if r["config"] == name and r["speed_up"] is not None
            ]
            ax.plot(*zip(*measured), "o", color=color, label=name)
            even = model.break_even_bandwidth(period, factor, execution)
            if 0 < even < math.inf:
                ax.axvline(even, color=color, linestyle=":", linewidth=1)
        ax.axhline(1, color="grey", linewidth=1)
        ax.set(xscale="log", yscale="log")
        ax.set_xlabel(
            "link, bits/s (shared by both workers; unshaped at ~20 Gbit/s)"
        )
        ax.set_ylabel("speed-up to target over synchronous")
        ax.set_title(
            "measured (dots); cost model, plain link (lines); "
            "break-even (dotted)"
        )
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)

    path = f"{prefix}speed_up.png"
    harness.figure(path, draw, size=(6.5, 4.5))
