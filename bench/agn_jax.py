"""`AGNOptimizer`'s throughput and memory against bare Adam on Keras's JAX.

Bare Adam and AGN(Adam, 10) with both commits, in float32 and bfloat16,
train a ReLU MLP round robin at `steps_per_execution` 1 and 10 (about 100M
parameters on a GPU; `--quick`, a small one for a CPU); then each one's
memory. What and how: docs/benchmarks/throughput.md#agn_jax.

    python bench/agn_jax.py [--quick] [--rounds R] [--inf-nan]
        [--bandwidth-gbs B]
"""

import json
import os
import resource
import subprocess
import sys

os.environ["KERAS_BACKEND"] = "jax"

import harness  # noqa: E402
import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from timing import fit_epoch  # noqa: E402

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
SPES = (1, 10)  # The steps_per_execution of every contender.
BF16 = {"communication_dtype": "bfloat16"}
VARIANTS = {"Adam": None} | {  # name: AGN's options (None: bare Adam).
    f"AGN(10) {commit}{suffix}": {"commit": commit, **options}
    for commit in ("gradients", "weight_change")
    for suffix, options in (("", {}), (" bf16", BF16))
}
# Its period end asked in each step (a conditional), as before
# `keras_clones.jax_trainer.period_programs`: Keras's own train function,
# for a model whose `train_step` is its own.
IN_STEP = "AGN(10) weight_change, period end in the step"
VARIANTS[IN_STEP] = {"commit": "weight_change", "in_step": True}
# With --inf-nan: AGN(10) weight_change under InfNanCheck, whose "stop"
# (and "raise") reads its counters each batch through the state sync.
UNCHECKED = "AGN(10) weight_change"
CHECKED = {
    f"{UNCHECKED} + InfNanCheck({mode})": {
        "commit": "weight_change",
        "check": mode,
    }
    for mode in ("skip", "stop")
}


FLAGS = [
    harness.Flag("--rounds", 5, quick=3, help="timed rounds"),
    harness.Flag(
        "--steps",
        60,
        quick=20,
        type=harness.multiple_of(PERIOD),
        help=f"steps per round, a multiple of {PERIOD}",
    ),
    harness.Flag(
        "--inf-nan",
        False,
        help="also AGN(10) weight_change under InfNanCheck skip and stop",
    ),
    harness.Flag(
        "--bandwidth-gbs",
        type=float,
        help="the device's memory bandwidth in GB/s, for the fraction "
        "bare Adam's update achieves",
    ),
]


def dataset(size):
    """`fit`'s data: the same 4 batches over and over, as a generator of
    NumPy batches (Keras's JAX trainer puts each on the device)."""
    features, _, _, batch = size
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(4 * batch, features)).astype("float32")
    y = rng.integers(0, CLASSES, size=4 * batch)
    batches = [
        (x[i : i + batch], y[i : i + batch]) for i in range(0, len(x), batch)
    ]
    while True:
        yield from batches


class PeriodEndInStep(keras.Sequential):
    """A Sequential model of its own `train_step` (Keras's), which Keras's
    own train function runs: the period end a conditional in each step."""

    def train_step(self, state, data):
        return super().train_step(state, data)


def compiled(options, steps_per_execution, size):
    """A fresh MLP of `size`, compiled with Adam or AGN of `options`."""
    features, hidden, layers, _ = size
    keras.utils.set_random_seed(SEED)
    options = dict(options) if options is not None else None
    in_step = options is not None and options.pop("in_step", False)
    model = (PeriodEndInStep if in_step else keras.Sequential)(
        [keras.Input((features,))]
        + [keras.layers.Dense(hidden, activation="relu") for _ in range(layers)]
        + [keras.layers.Dense(CLASSES)]
    )
    optimizer = keras.optimizers.Adam(1e-4)
    if options is not None:
        options = {k: v for k, v in options.items() if k != "check"}
        optimizer = AGNOptimizer(optimizer, PERIOD, **options)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution,
    )
    return model


def variants(args):
    return dict(VARIANTS, **(CHECKED if args.inf_nan else {}))


def measure(args):
    """Round-robin steps/s per (name, steps_per_execution); the
    parameters; each variant's memory, in a process of its own."""
    size = SIZES["quick" if args.quick else "gpu"]
    print(
        f"JAX {jax.__version__}, Keras {keras.__version__}, "
        f"{jax.devices()[0].device_kind} ({jax.default_backend()}); MLP "
        f"{size[:3]} at batch {size[3]}; {args.rounds} rounds of "
        f"{args.steps} steps, interleaved."
    )
    options = variants(args)
    models = {
        (name, spe): compiled(options[name], spe, size)
        for spe in SPES
        for name in options
    }
    for model in models.values():  # Warm up: compile the train function.
        fit_epoch(model, dataset(size), PERIOD)

    def run_once(key, repeat):
        check = (options[key[0]] or {}).get("check")
        callbacks = [InfNanCheck(check)] if check else []
        timer = fit_epoch(models[key], dataset(size), args.steps, callbacks)
        # From the second call of the train function: a `fit` under
        # InfNanCheck compiles its step again (its guard is new), once.
        steps_per_s = timer.rest_steps / timer.rest_seconds
        return {"steps_per_s": steps_per_s, "loss": timer.loss}

    runs = harness.round_robin(list(models), run_once, args.rounds)
    model = next(iter(models.values()))
    parameters = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    memory = {}
    for name in VARIANTS:
        command = [sys.executable, __file__, harness.WORKER_FLAG, name]
        command += ["--quick"] if args.quick else []
        done = subprocess.run(
            command, capture_output=True, text=True, check=True
        )
        memory[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return {"runs": runs, "parameters": parameters, "memory": memory}


def memory_of(argv):
    """Prints one variant's optimizer bytes and peak after a few steps, in
    this process alone (`argv`: its name, and `--quick` or not)."""
    size = SIZES["quick" if "--quick" in argv else "gpu"]
    model = compiled(VARIANTS[argv[0]], 1, size)
    fit_epoch(model, dataset(size), PERIOD)
    stats = jax.devices()[0].memory_stats() or {}
    peak, where = stats.get("peak_bytes_in_use"), "device"
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        where = "rss"
    optimizer = sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
        for v in model.optimizer.variables
    )
    print(json.dumps({"optimizer": optimizer, "peak": peak, "where": where}))


def median_speed(runs, name, spe):
    return harness.summary([r["steps_per_s"] for r in runs[name, spe]])[1]


def throughput_tables(runs, args):
    rows = []
    for spe in SPES:
        for name in variants(args):
            speeds = harness.summary(
                [r["steps_per_s"] for r in runs[name, spe]]
            )
            rows.append([name, spe, *(f"{s:.1f}" for s in speeds)])
            rows[-1].append(f"{runs[name, spe][-1]['loss']:.4f}")
    ratio_rows = []
    on_cpu = jax.default_backend() == "cpu"
    for spe in SPES:
        for name, options in list(variants(args).items())[1:]:
            commit = options["commit"]
            goal = CPU_GOAL if on_cpu else GOALS[commit]
            if "check" in options or (on_cpu and commit != "weight_change"):
                goal = None
            if name == IN_STEP:
                goal = None
            ratios = harness.ratios_of(
                runs[name, spe], runs["Adam", spe], "steps_per_s"
            )
            ratio_rows.append(
                [f"{name} / Adam, spe {spe}", *(f"{r:.3f}" for r in ratios)]
                + [goal or "-", harness.met(ratios, goal) if goal else "-"]
            )
        ratios = harness.ratios_of(
            runs[UNCHECKED, spe], runs[IN_STEP, spe], "steps_per_s"
        )
        ratio_rows.append(
            [f"{UNCHECKED} / {IN_STEP}, spe {spe}"]
            + [f"{r:.3f}" for r in ratios]
            + ["-", "-"]
        )
    return (
        harness.table(
            ["contender", "steps_per_execution", "best steps/s"]
            + ["median steps/s", "last loss"],
            rows,
        )
        + "\n"
        + harness.table(
            ["ratio", "best-of", "median", "per-repeat median", "goal"]
            + ["met (best / median / per-repeat)"],
            ratio_rows,
            align="lrrrrl",
        )
    )


def report(data, args):
    runs = data["runs"]
    print(throughput_tables(runs, args))
    if args.inf_nan:  # What InfNanCheck adds per step, medians.
        for spe in SPES:
            unchecked = median_speed(runs, UNCHECKED, spe)
            for name in CHECKED:
                added = 1e3 / median_speed(runs, name, spe) - 1e3 / unchecked
                print(
                    f"{name[len(UNCHECKED) + 3 :]}, spe {spe}: {added:+.2f} "
                    f"ms per step over {UNCHECKED} ({1e3 / unchecked:.2f} ms)."
                )
        print()
    parameters = data["parameters"]
    for spe in SPES:
        gbs = parameters * ADAM_BYTES_PER_PARAMETER / 1e9
        gbs *= median_speed(runs, "Adam", spe)
        fraction = ""
        if args.bandwidth_gbs:
            fraction = f", {gbs / args.bandwidth_gbs:.2f} of "
            fraction += f"{args.bandwidth_gbs:g}"
        print(
            f"bare Adam, spe {spe}: {parameters / 1e6:.1f}M parameters, its "
            f"update moves {gbs:.0f} GB/s (median){fraction}."
        )
    print()
    rows = [
        [name, f"{m['optimizer'] / 1e6:.1f}", f"{m['peak'] / 1e6:.1f}"]
        + [m["where"]]
        for name, m in data["memory"].items()
    ]
    print(
        harness.table(
            ["contender", "optimizer variables (MB)", "peak (MB)", "peak of"],
            rows,
            align="lrrl",
        ),
        end="",
    )


BENCHMARK = harness.Benchmark(
    __doc__,
    measure,
    report,
    flags=FLAGS,
    quick="a small MLP, 3 rounds of 20 steps: a CPU check",
    worker=memory_of,
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
