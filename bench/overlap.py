"""Time to the slow-link target with overlapped and fragmented AGN commits
(issue 26): 2 workers, `bench/wan.py`'s task and target.

1. *The target*: synchronous training as `bench/wan.py` trains it (seeds 0,
   1, 2, 30 epochs of 40 steps); its final mean held-out accuracy less 0.5
   points.
2. *Steps to target* (unshaped link): `bench/wan.py`'s fastest
   configuration at 100 Mbit/s, averaging p=64 (inner AdamW, outer SGD(1)),
   without overlap, with `overlap=True` (mixing 0.5) and with overlap and
   `fragments=4`; seeds 0, 1, 2; 17 periods (1,088 steps; `bench/wan.py`'s
   local runs: 1,080), epochs of one period (`steps_per_execution` 64, with
   fragments 16). The global model (the centers, the commit in flight not
   applied: what a worker could hand out at that step) is scored at every
   period's end; "final" is after `fit`, which applies the commit in flight.
3. *Time per step*, seed 0, on the unshaped loopback and at 100 Mbit/s
   (`bench/netns.py`): each variant and synchronous training trained in
   turn on each link, `repeats` times (interleaved), each time in a `fit`
   of its own whose first period (nothing in flight) is left out; at least
   50 periods a cell over the repeats. ms per step: the median period over
   its steps.
4. *Time to target* = steps to target x ms per step; the cost model
   (`keras_clones.cost_model`, fitted on the unshaped link's synchronous and
   no-overlap cells) predicts each cell; with overlap, a period costs its
   compute and logs plus what of the round its steps do not cover.
   Hidden fraction at 100 Mbit/s: `(without - with) / (without - unshaped
   without)`, goal at least 0.7, with final accuracy within the seeds'
   spread of the run without overlap (or above it).

Prints the tables, writes `bench/out/overlap.json` and
`bench/figures/overlap_accuracy.png`. Without root, the unshaped link only.
`--quick`: 1,000 / 500 digits, seed 0, synchronous 2 epochs, 2 periods,
timing blocks of 3 periods, 1 repeat.

Usage (as root, for the namespace):
    python bench/overlap.py [--quick] [--out DIR] [--figures DIR]
                            [--from-json PATH]
"""

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import time

import agn_rounds
import flags
import launching
import netns
import wan_report

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKER_FLAG = "--worker"
RESULT, PROGRESS = agn_rounds.RESULT, agn_rounds.PROGRESS
PERIOD = 64
SYNC = agn_rounds.config_name("sync", 1)
# Name: (overlap, fragments).
VARIANTS = {
    "averaging p=64": (False, 1),
    "averaging p=64 overlap": (True, 1),
    "averaging p=64 overlap 4 fragments": (True, 4),
}
WITHOUT = "averaging p=64"
LINKS = ("unshaped", "100mbit")
PLAN = {
    "seeds": [0, 1, 2],
    "sync_epochs": 30,
    "periods": 17,
    "periods_per_block": 18,  # 17 counted: 51 a cell over 3 repeats.
    "sync_epochs_per_block": 3,  # 2 counted: 80 steps a repeat.
    "repeats": 3,
}
QUICK_PLAN = dict(
    PLAN,
    seeds=[0],
    sync_epochs=2,
    periods=2,
    periods_per_block=3,
    sync_epochs_per_block=2,
    repeats=1,
)
HIDDEN_GOAL = 0.7
TIMEOUT = 3600


# The workers.


def worker_main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument(WORKER_FLAG, action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--links", required=True)
    args = parser.parse_args(argv)
    strategy = launching.multi_worker_strategy()
    plan = QUICK_PLAN if args.quick else PLAN
    result = train_and_time(strategy, plan, args.links.split(","), args.quick)
    if result is not None:
        print(RESULT + json.dumps(result), flush=True)


def trainers(strategy, data, chief, shaped):
    """`(synchronous, overlap)`: `bench/wan.py`'s trainer, and one whose
    epochs are a period and whose AGN takes a variant's options."""
    import keras
    import wan_worker

    import keras_clones

    class OverlapTrainer(wan_worker.WanTrainer):
        def __init__(self):
            super().__init__(strategy, data, chief, shaped)
            self.steps_per_epoch = PERIOD
            self.variant = WITHOUT

        def optimizer(self, rule, period, dtype, lr):
            config = super().optimizer(rule, period, dtype, lr).get_config()
            overlap, fragments = VARIANTS[self.variant]
            config.update(overlap=overlap, fragments=fragments)
            return keras_clones.AGNOptimizer.from_config(config)

        def build(self, rule, period, dtype, seed, lr):
            model, optimizer = super().build(rule, period, dtype, seed, lr)
            with self.strategy.scope():  # An execution per fragment.
                model.compile(
                    optimizer,
                    "sparse_categorical_crossentropy",
                    steps_per_execution=PERIOD // optimizer.fragments,
                )
            return model, optimizer

        def scorer(self, model, optimizer):
            """The centers' held-out accuracy, without applying the commit
            in flight (which would change the run)."""
            predict = self.tf.function(lambda x: model(x, training=False))
            x_held_out = self.tf.constant(self.x_held_out)
            variables = model.trainable_variables
            assert len(variables) == len(model.weights)

            def score():
                local = [v.numpy() for v in variables]
                for v in variables:
                    v.assign(optimizer.global_center_variable(v))
                predictions = predict(x_held_out).numpy().argmax(axis=-1)
                for v, value in zip(variables, local):
                    v.assign(value)
                return float((predictions == self.y_held_out).mean())

            return score

        def run_variant(self, variant, seed, periods):
            self.variant = variant
            lr = agn_rounds.LEARNING_RATES["average"]
            model, optimizer = self.build("average", PERIOD, None, seed, lr)
            score, records = self.scorer(model, optimizer), []

            def record(epoch, logs):
                records.append(
                    {
                        "epoch": epoch + 1,
                        "steps": int(optimizer.local_step.numpy()),
                        "all_reduces": int(
                            optimizer.communication_rounds.numpy()
                        ),
                        "accuracy": score(),
                    }
                )

            callback = keras.callbacks.LambdaCallback(on_epoch_end=record)
            self.fit(model, seed, periods, [callback])
            return {
                "config": variant,
                "rule": "average",
                "period": PERIOD,
                "communication_dtype": None,
                "seed": seed,
                "bytes_per_round": optimizer.bytes_per_round,
                "records": records,
                "final": score(),  # After fit's flush.
            }

    return wan_worker.WanTrainer(
        strategy, data, chief, shaped
    ), OverlapTrainer()


def seconds_per_step(trainer, model, epochs, unit_executions):
    """Trains `model` for `epochs` in one `fit`: the seconds per step of
    each unit of `unit_executions` executions, the first unit (nothing in
    flight) left out."""
    import keras
    import overlap_probe

    recorder = overlap_probe.ExecutionTimes(keras)
    trainer.fit(model, 0, epochs, [recorder.callback])
    seconds = recorder.seconds[unit_executions:]
    steps = unit_executions * model.steps_per_execution
    return [
        sum(seconds[i : i + unit_executions]) / steps
        for i in range(0, len(seconds), unit_executions)
    ]


def train_and_time(strategy, plan, links, quick):
    """Steps to target and time per step; the chief's records."""
    chief = strategy.cluster_resolver.task_id == 0
    shaped = any(link != "unshaped" for link in links)
    data = agn_rounds.load_data(quick)
    sync, trainer = trainers(strategy, data, chief, shaped)
    start = time.perf_counter()

    def progress(text):
        if chief:
            seconds = time.perf_counter() - start
            print(f"{PROGRESS}{text} ({seconds:.0f} s)", flush=True)

    lrs = agn_rounds.LEARNING_RATES
    runs = []
    for seed in plan["seeds"]:
        epochs = plan["sync_epochs"]
        runs.append(sync.run("sync", 1, None, seed, epochs, lrs["sync"]))
        for variant in VARIANTS:
            runs.append(trainer.run_variant(variant, seed, plan["periods"]))
            progress(f"{variant} seed {seed}: final {runs[-1]['final']:.4f}")
    # Time per step: one model each, seed 0, interleaved on the links.
    models = {SYNC: sync.build("sync", 1, None, 0, lrs["sync"])[0]}
    for variant in VARIANTS:
        trainer.variant = variant
        models[variant] = trainer.build(
            "average", PERIOD, None, 0, lrs["average"]
        )[0]
    units = {}
    for name, model in models.items():  # Trace; a round; unshaped.
        owner = sync if name == SYNC else trainer
        owner.fit(model, 0, 2 * PERIOD // owner.steps_per_epoch, [])
    for _ in range(plan["repeats"]):
        for link in links:
            trainer.use_link(link)
            for name, model in models.items():
                if name == SYNC:
                    epochs, owner = plan["sync_epochs_per_block"], sync
                    executions = 1
                else:
                    epochs, owner = plan["periods_per_block"], trainer
                    executions = PERIOD // model.steps_per_execution
                units.setdefault(f"{name}|{link}", []).extend(
                    seconds_per_step(owner, model, epochs, executions)
                )
            progress(f"timed on {link}")
    trainer.use_link("unshaped")
    if not chief:
        return None
    import keras
    import tensorflow as tf

    return {
        "meta": {
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "links": links,
            "shaped": shaped,
            "plan": plan,
            "sync_steps_per_execution": sync.steps_per_epoch,
            "train_size": len(data[1]),
            "held_out_size": len(data[3]),
            "seconds": time.perf_counter() - start,
        },
        "runs": runs,
        "seconds_per_step": units,
    }


# The driver.


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="The 100 Mbit/s link needs root, ip and tc (bench/netns.py).",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run (a few minutes)"
    )
    flags.add_record_flags(parser, ROOT)
    args = parser.parse_args(argv)
    if args.figures is None:
        figures = ROOT / "bench" / "figures"
        args.figures = args.out if args.quick else str(figures)
    return args


def run(quick):
    """Launches the workers (in a namespace if root); their records."""
    problem = netns.missing_requirements()
    arguments = [__file__, WORKER_FLAG] + (["--quick"] if quick else [])
    prefix = "[worker 0] "

    def show_progress(line):
        if line.startswith(prefix + PROGRESS):
            print(line[len(prefix + PROGRESS) :], flush=True)

    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        links, wrap = ["unshaped"], None
        if problem is None:
            wrap = stack.enter_context(netns.Namespace()).command
            links = list(LINKS)
        else:
            print(f"bench/overlap.py {problem}: the unshaped link only.")
        status, lines = launching.run_launch(
            agn_rounds.WORKERS,
            arguments + ["--links", ",".join(links)],
            TIMEOUT,
            env=dict(os.environ, KERAS_BACKEND="tensorflow"),
            on_line=show_progress,
            wrap=wrap,
        )
    data = launching.printed_result(lines, prefix + RESULT)
    if data is None:
        launching.print_failure("bench/overlap.py's launch", status, lines)
    else:
        data["meta"]["wall_s"] = time.perf_counter() - start
    return data


def main(argv=None):
    args = parse_args(argv)
    data = flags.records(args, lambda: run(args.quick), "overlap.json")
    if data is None:
        return 1
    report(data, args.figures)
    return 0


# The report.


def cells(data):
    """Per `(name, link)`: the median, best and count of the seconds per
    step of its units (a period; synchronous training, an execution)."""
    result = {}
    for key, values in data["seconds_per_step"].items():
        name, link = key.split("|")
        result[name, link] = {
            "median": statistics.median(values),
            "best": min(values),
            "units": len(values),
        }
    return result


def fit_cost(data, measured):
    """The cost model fitted on the unshaped link's synchronous and
    no-overlap cells."""
    cost_model = launching.package_module("cost_model")
    meta = data["meta"]
    without = next(r for r in data["runs"] if r["config"] == WITHOUT)
    bytes_per_round = without["bytes_per_round"]
    points = [
        (1, meta["sync_steps_per_execution"], measured[SYNC, "unshaped"]),
        (PERIOD, PERIOD, measured[WITHOUT, "unshaped"]),
    ]
    return cost_model.fit_step_cost(
        [(p, e, m["median"]) for p, e, m in points],
        bytes_per_round,
        agn_rounds.WORKERS,
    )


def predicted(cost, name, link, sync_execution):
    """The cost model's seconds per step of `name` on `link`. With
    overlap, each of the period's `fragments` rounds (of a fragment's bytes)
    runs beside the next `period / fragments` steps: a step costs its
    compute and logs, plus what of the round those steps do not cover."""
    link = netns.LINKS[link]
    burst = 0.0 if link.rate is None else link.burst_bytes
    if name == SYNC:
        return cost.step_seconds(1, link.bits_per_second, sync_execution)
    overlap, fragments = VARIANTS[name]
    if not overlap:
        return cost.step_seconds(PERIOD, link.bits_per_second, PERIOD, burst)
    steps = PERIOD // fragments
    share = dataclasses.replace(cost, model_bytes=cost.model_bytes / fragments)
    compute = cost.compute_seconds * steps
    round_ = share.round_seconds(link.bits_per_second, burst, compute)
    logs = cost.collective_overhead
    return (compute + logs + max(0.0, round_ - compute)) / steps


def report(data, figures_directory):
    meta = data["meta"]
    steps = wan_report.analyse_steps(data["runs"])
    measured = cells(data)
    try:
        cost = fit_cost(data, measured)
    except ValueError as error:  # A quick run's noise.
        print(f"No cost model: {error}")
        cost = None
    finals = {}
    for run in data["runs"]:
        final = run.get("final", run["records"][-1]["accuracy"])
        finals.setdefault(run["config"], []).append(final)
    print(
        f"\nTensorFlow {meta['tensorflow']}, Keras {meta['keras']}; 2 "
        f"workers; wall time {meta.get('wall_s', 0):.0f} s. "
        f"{meta['train_size']:,} training and {meta['held_out_size']:,} "
        f"held-out digits, global batch {agn_rounds.GLOBAL_BATCH}."
    )
    for link in meta["links"]:
        print(f"Link {netns.LINKS[link].describe()}.")
    print(
        f"\nTarget {steps['target']:.4f}: synchronous training's final mean "
        f"less {100 * wan_report.POINTS_BELOW:g} points.\n"
    )
    print(
        "| config | seeds | final accuracy, mean (min-max) | to target: "
        "steps, all-reduces |\n|---|---:|---|---:|"
    )
    for name, values in finals.items():
        point = steps["rows"][name]["target"]
        reach = f"{point['steps']}, {point['all_reduces']}" if point else "not"
        print(
            f"| {name} | {len(values)} | {statistics.mean(values):.4f} "
            f"({min(values):.4f}-{max(values):.4f}) | {reach} |"
        )
    print(
        "\n| link | config | ms/step median (best; units) | predicted | "
        "time to target, s |\n|---|---|---:|---:|---:|"
    )
    for link in meta["links"]:
        for name in [SYNC, *VARIANTS]:
            cell = measured[name, link]
            point = steps["rows"][name]["target"]
            model = "-"
            if cost is not None:
                seconds = predicted(
                    cost, name, link, meta["sync_steps_per_execution"]
                )
                model = f"{1000 * seconds:.1f}"
            to_target = (
                f"{point['steps'] * cell['median']:.1f}" if point else "-"
            )
            print(
                f"| {link} | {name} | {1000 * cell['median']:.2f} "
                f"({1000 * cell['best']:.2f}; {cell['units']}) | {model} | "
                f"{to_target} |"
            )
    verdicts(measured, finals, meta["links"])
    figure(steps, measured, meta["links"], figures_directory)


def verdicts(measured, finals, links):
    """The hidden fraction at 100 Mbit/s, and each variant's final
    accuracy against the spread of the seeds without overlap."""
    low, high = min(finals[WITHOUT]), max(finals[WITHOUT])
    print()
    for name in list(VARIANTS)[1:]:
        mean = statistics.mean(finals[name])
        where = "within" if low <= mean <= high else "above"
        where = "BELOW" if mean < low else where
        print(
            f"{name}: final mean {mean:.4f}, {where} the seeds' spread "
            f"without overlap ({low:.4f}-{high:.4f})."
        )
        if "100mbit" not in links:
            continue
        without = measured[WITHOUT, "100mbit"]["median"]
        floor = measured[WITHOUT, "unshaped"]["median"]
        hidden = (without - measured[name, "100mbit"]["median"]) / (
            without - floor
        )
        goal = "meets" if hidden >= HIDDEN_GOAL else "misses"
        print(
            f"{name}: hidden fraction at 100 Mbit/s {hidden:.2f} ({goal} "
            f"the goal of {HIDDEN_GOAL})."
        )


def figure(steps, measured, links, directory):
    """`overlap_accuracy.png`: the global model's held-out accuracy (mean
    of the seeds) against training seconds (steps x ms/step), per link."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(links), figsize=(5 * len(links), 4))
    axes = [axes] if len(links) == 1 else axes
    for ax, link in zip(axes, links):
        for name, curve in steps["curves"].items():
            per_step = measured[name, link]["median"]
            ax.plot(
                [p["steps"] * per_step for p in curve],
                [p["mean"] for p in curve],
                label=name,
            )
        ax.axhline(steps["target"], color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_ylim(0.85, 0.96)
        ax.set_title(netns.LINKS[link].name)
        ax.set_xlabel("training seconds (steps x median ms/step)")
    axes[0].set_ylabel("held-out accuracy of the centers, mean of seeds")
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "overlap_accuracy.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"\nWrote {path}.")


if __name__ == "__main__":
    if WORKER_FLAG in sys.argv:
        worker_main(sys.argv[1:])
    else:
        sys.exit(main())
