"""AGNOptimizer's throughput and memory on Keras's JAX backend, against
bare Adam.

What it measures: steps per second of `Model.fit` for a ReLU MLP on
synthetic data (on a GPU by default about 100M parameters at batch 2048;
`--quick`, a small one for a CPU), trained by bare Adam and by
`AGNOptimizer(Adam, communication_period=10)` with `commit="gradients"`
and `"weight_change"`, each with float32 and bfloat16 commits, at
`steps_per_execution` 1 and 10 (jitted, as Keras compiles on JAX). It
needs only `keras` and JAX (no TensorFlow).

How: every contender is a plain `keras.Model` with the same initial
weights and its own fresh optimizer, warmed up by one short `fit` (which
compiles the step). Then R rounds run the contenders round robin (A B C
... A B C ...), each round one `fit` epoch of a fixed number of steps (a
multiple of the period and of `steps_per_execution`), timed from the
start of its second call of the train function to `on_epoch_end` (a `fit`
under InfNanCheck compiles its step again, once), so that machine noise
hits all contenders alike. It prints the best-of and median steps per
second, the ratios AGN / bare Adam at the same `steps_per_execution`
(best-of, median, per-round median), and bare Adam's achieved bytes per
second: Adam's
update reads the weights, gradients and two slots and writes the weights
and slots, 7 x 4 bytes per parameter, which is memory-bound on a GPU
(give the card's bandwidth with `--bandwidth-gbs` for the fraction).

With `--inf-nan`, AGN(10) `weight_change` also runs under
`keras_clones.callbacks.InfNanCheck` in modes "skip" (its counters ride in
the optimizer's state, read at each epoch's end) and "stop" (read after
every batch, which on JAX first syncs the step's state back into the
variables and waits for the step): it prints the milliseconds each adds
per step ("raise" reads as "stop" does).

Memory: the bytes each contender's optimizer keeps in its variables
(AGN adds a center per weight, an accumulator per weight with
`commit="gradients"`, and the outer optimizer's state), and, in a process
of its own per contender, the device's peak bytes in use after a few
steps (`memory_stats()["peak_bytes_in_use"]` where the device reports it,
else the process's peak resident memory).

Goals (issue 38): on JAX CPU, AGN(10) with `weight_change` >= 0.95 of
bare Adam; on a GPU, `weight_change` >= 0.97 and `gradients` >= 0.90.

Usage:
    python bench/agn_jax.py [--quick] [--rounds R] [--inf-nan]
        [--bandwidth-gbs B]
"""

import argparse
import json
import os
import resource
import subprocess
import sys

os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from flags import positive_int  # noqa: E402
from harness import fit_epoch  # noqa: E402
from ratios import RATIO_HEADER  # noqa: E402
from ratios import met  # noqa: E402
from ratios import ratios_of  # noqa: E402
from ratios import summary  # noqa: E402

from keras_clones import AGNOptimizer  # noqa: E402
from keras_clones.callbacks import InfNanCheck  # noqa: E402

SEED = 0
PERIOD = 10
CLASSES = 10
ADAM_BYTES_PER_PARAMETER = 7 * 4  # Read w, g, m, v; write w, m, v.
GOALS = {"weight_change": 0.97, "gradients": 0.90}
CPU_GOAL = 0.95  # weight_change, on JAX CPU.
# (features, hidden units, hidden layers, batch): about 100M parameters at
# batch 2048, or a small MLP for a CPU.
SIZES = {"gpu": (1024, 4096, 6, 2048), "quick": (256, 512, 2, 256)}
VARIANTS = {  # name: AGNOptimizer's options, or None for bare Adam.
    "Adam": None,
    "AGN(10) gradients": {"commit": "gradients"},
    "AGN(10) gradients bf16": {
        "commit": "gradients",
        "communication_dtype": "bfloat16",
    },
    "AGN(10) weight_change": {"commit": "weight_change"},
    "AGN(10) weight_change bf16": {
        "commit": "weight_change",
        "communication_dtype": "bfloat16",
    },
}
# With --inf-nan: AGN(10) weight_change under InfNanCheck, whose "stop"
# (and "raise") reads its counters each batch through the state sync.
CHECKED = {
    f"AGN(10) weight_change + InfNanCheck({mode})": {
        "commit": "weight_change",
        "check": mode,
    }
    for mode in ("skip", "stop")
}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a small MLP, 3 rounds of 20 steps: a CPU check",
    )
    parser.add_argument("--rounds", type=positive_int, default=None)
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        help="steps per round, a multiple of 10 (default 60; --quick 20)",
    )
    parser.add_argument(
        "--inf-nan",
        action="store_true",
        help="also AGN(10) weight_change under InfNanCheck skip and stop",
    )
    parser.add_argument(
        "--bandwidth-gbs",
        type=float,
        default=None,
        help="the device's memory bandwidth in GB/s, for the fraction "
        "bare Adam's update achieves",
    )
    parser.add_argument(
        "--memory-of",
        default=None,
        help=argparse.SUPPRESS,  # One contender's peak, in its own process.
    )
    args = parser.parse_args()
    args.size = SIZES["quick" if args.quick else "gpu"]
    args.variants = dict(VARIANTS, **(CHECKED if args.inf_nan else {}))
    args.rounds = args.rounds or (3 if args.quick else 5)
    args.steps = args.steps or (20 if args.quick else 60)
    if args.steps % PERIOD:
        parser.error(f"--steps must be a multiple of {PERIOD}.")
    return args


def data(size):
    features, _, _, batch = size
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(4 * batch, features)).astype("float32")
    y = rng.integers(0, CLASSES, size=4 * batch)
    return x, y


def mlp(size):
    features, hidden, layers, _ = size
    keras.utils.set_random_seed(SEED)
    return keras.Sequential(
        [keras.Input((features,))]
        + [keras.layers.Dense(hidden, activation="relu") for _ in range(layers)]
        + [keras.layers.Dense(CLASSES)]
    )


def optimizer_for(options):
    adam = keras.optimizers.Adam(1e-4)
    if options is None:
        return adam
    options = {k: v for k, v in options.items() if k != "check"}
    return AGNOptimizer(adam, PERIOD, **options)


def compiled(options, steps_per_execution, size):
    model = mlp(size)
    model.compile(
        optimizer=optimizer_for(options),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution,
    )
    return model


class Repeated:
    """`fit`'s data: the same batches over and over, as a generator of
    NumPy batches (Keras's JAX trainer puts each on the device)."""

    def __init__(self, x, y, batch):
        self.batches = [
            (x[i : i + batch], y[i : i + batch])
            for i in range(0, len(x), batch)
        ]

    def __call__(self):
        while True:
            yield from self.batches


def epoch(model, args, x, y, options):
    dataset = Repeated(x, y, args.size[3])()
    check = (options or {}).get("check")
    callbacks = [InfNanCheck(check)] if check else []
    timer = fit_epoch(model, dataset, args.steps, callbacks)
    # From the second call of the train function: a `fit` under
    # InfNanCheck compiles its step again (its guard is new), once.
    return timer.rest_seconds / timer.rest_steps, timer.loss


def contenders(args):
    return [
        (name, spe, compiled(options, spe, args.size))
        for spe in (1, 10)
        for name, options in args.variants.items()
    ]


def measure(args):
    x, y = data(args.size)
    models = contenders(args)
    for _, _, model in models:  # Warm up: compile the train function.
        model.fit(
            Repeated(x, y, args.size[3])(),
            steps_per_epoch=PERIOD,
            shuffle=False,
            verbose=0,
        )
    runs = []
    for repeat in range(args.rounds):
        for name, spe, model in models:
            options = args.variants[name]
            seconds_per_step, loss = epoch(model, args, x, y, options)
            runs.append(
                {
                    "name": name,
                    "spe": spe,
                    "repeat": repeat,
                    "steps_per_s": 1 / seconds_per_step,
                    "loss": loss,
                }
            )
    return models, runs


def of(runs, name, spe):
    return [r for r in runs if r["name"] == name and r["spe"] == spe]


def throughput_table(runs, args):
    print(
        "| contender | steps_per_execution | best steps/s | median steps/s "
        "| last loss |"
    )
    print("|---|---:|---:|---:|---:|")
    for spe in (1, 10):
        for name in args.variants:
            mine = of(runs, name, spe)
            best, median = summary([r["steps_per_s"] for r in mine])
            print(
                f"| {name} | {spe} | {best:.1f} | {median:.1f} "
                f"| {mine[-1]['loss']:.4f} |"
            )
    print()
    print("\n".join(RATIO_HEADER))
    on_cpu = jax.default_backend() == "cpu"
    for spe in (1, 10):
        bare = of(runs, "Adam", spe)
        for name, options in args.variants.items():
            if options is None:
                continue
            goal = CPU_GOAL if on_cpu else GOALS[options["commit"]]
            if "check" in options or (
                on_cpu and options["commit"] != "weight_change"
            ):
                goal = None
            ratios = ratios_of(of(runs, name, spe), bare, "steps_per_s")
            shown = " | ".join(f"{r:.3f}" for r in ratios)
            print(
                f"| {name} / Adam, spe {spe} | {shown} "
                f"| {goal if goal else '-'} "
                f"| {met(ratios, goal) if goal else '-'} |"
            )


def check_costs(runs):
    """What InfNanCheck adds per step to AGN(10) weight_change, in
    milliseconds (medians)."""
    base = "AGN(10) weight_change"
    for spe in (1, 10):
        speeds = {
            name: summary([r["steps_per_s"] for r in of(runs, name, spe)])[1]
            for name in (base, *CHECKED)
        }
        unchecked = speeds[base]
        for name in CHECKED:
            checked = speeds[name]
            added = 1e3 / checked - 1e3 / unchecked
            print(
                f"{name[len(base) + 3 :]}, spe {spe}: {added:+.2f} ms per "
                f"step over {base} ({1e3 / unchecked:.2f} ms)."
            )


def bandwidth_line(models, runs, args):
    parameters = sum(
        int(np.prod(v.shape)) for v in models[0][2].trainable_variables
    )
    for spe in (1, 10):
        _, median = summary([r["steps_per_s"] for r in of(runs, "Adam", spe)])
        gbs = parameters * ADAM_BYTES_PER_PARAMETER * median / 1e9
        fraction = ""
        if args.bandwidth_gbs:
            fraction = (
                f", {gbs / args.bandwidth_gbs:.2f} of {args.bandwidth_gbs:g}"
            )
        print(
            f"bare Adam, spe {spe}: {parameters / 1e6:.1f}M parameters, its "
            f"update moves {gbs:.0f} GB/s (median){fraction}."
        )


def optimizer_bytes(model):
    return sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
        for v in model.optimizer.variables
    )


def peak_bytes():
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return stats["peak_bytes_in_use"], "device"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "rss"


def memory_of(name, args):
    """One contender's peak after a few steps, in this process alone."""
    x, y = data(args.size)
    model = compiled(VARIANTS[name], 1, args.size)
    model.fit(
        Repeated(x, y, args.size[3])(),
        steps_per_epoch=PERIOD,
        shuffle=False,
        verbose=0,
    )
    peak, where = peak_bytes()
    print(
        json.dumps(
            {"optimizer": optimizer_bytes(model), "peak": peak, "where": where}
        )
    )


def memory_table(args):
    print("| contender | optimizer variables (MB) | peak (MB) | peak of |")
    print("|---|---:|---:|---|")
    for name in VARIANTS:
        command = [sys.executable, __file__, "--memory-of", name]
        if args.quick:
            command.append("--quick")
        out = subprocess.run(
            command, capture_output=True, text=True, check=True
        ).stdout
        result = json.loads(out.strip().splitlines()[-1])
        print(
            f"| {name} | {result['optimizer'] / 1e6:.1f} "
            f"| {result['peak'] / 1e6:.1f} | {result['where']} |"
        )


def main():
    args = parse_args()
    if args.memory_of:
        memory_of(args.memory_of, args)
        return
    device = jax.devices()[0]
    print(
        f"JAX {jax.__version__}, Keras {keras.__version__}, "
        f"{device.device_kind} ({jax.default_backend()}); MLP "
        f"{args.size[:3]} at batch {args.size[3]}; {args.rounds} rounds of "
        f"{args.steps} steps, interleaved."
    )
    models, runs = measure(args)
    throughput_table(runs, args)
    print()
    if args.inf_nan:
        check_costs(runs)
        print()
    bandwidth_line(models, runs, args)
    print()
    memory_table(args)


if __name__ == "__main__":
    main()
