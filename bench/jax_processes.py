"""AGN across JAX processes against AGN across TensorFlow workers, and
against `keras.distribution.DataParallel` across the same processes.

What it measures: steps per second of `fit` of `bench/multiworker.py`'s
task (an MLP 64-256-256-2, SGD(0.01, momentum=0.9), 128 rows per worker,
the global batch 256) on 2 local processes, for:

1. "JAX AGN(10) 2p": a plain `keras.Model` on Keras's JAX backend compiled
   with `AGNOptimizer(SGD, 10)`, across 2 JAX processes
   (`KERAS_BACKEND=jax python -m keras_clones.launch --workers 2`), each
   fitting its 128 rows of every global batch;
2. "JAX DataParallel 2p": the same model with the bare SGD under
   `keras.distribution.DataParallel()` across the same 2 processes (every
   step all-reduces the gradients);
3. "TF AGN(10) 2w": `bench/multiworker.py`'s AGN(10) 2w, a `CloneModel`
   under `MultiWorkerMirroredStrategy` on 2 TensorFlow workers;

each with `steps_per_execution` 1 and 10 ("x10"). Each side runs from its
own venv (`--jax-python`, `--tf-python`: the launcher starts
`sys.executable`), as `make test` builds them. R repeats run the variants
round robin; each run trains E epochs of S steps, the first not timed
(tracing), and its chief prints the steps/s of the others (timed as
`bench/multiworker.py` times them). The driver prints best-of and median
per variant and their ratios, against the goal: JAX AGN(10) >= 1.5 x TF
AGN(10), at 1 and at 10 steps per execution.

Usage:
    python bench/jax_processes.py [--quick] [--repeats R] [--steps S]
                                  [--epochs E]
"""

import argparse
import json
import os
import pathlib
import sys
import time

import launching
import multiworker
import synthetic_mlp
from flags import positive_int
from ratios import ratio_table

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER_FLAG = "--jax-worker"
ROWS = multiworker.GLOBAL_BATCH // 2  # Per process and step.
PERIOD = 10

JAX_AGN, JAX_AGN_X = "JAX AGN(10) 2p", "JAX AGN(10) 2p x10"
JAX_DP, JAX_DP_X = "JAX DataParallel 2p", "JAX DataParallel 2p x10"
TF_AGN, TF_AGN_X = "TF AGN(10) 2w", "TF AGN(10) 2w x10"
# name: (side, JAX worker kind, steps per execution)
VARIANTS = {
    JAX_AGN: ("jax", "agn", 1),
    JAX_AGN_X: ("jax", "agn", 10),
    JAX_DP: ("jax", "data_parallel", 1),
    JAX_DP_X: ("jax", "data_parallel", 10),
    TF_AGN: ("tf", None, 1),
    TF_AGN_X: ("tf", None, 10),
}
RATIOS = [
    (JAX_AGN, TF_AGN, 1.5),
    (JAX_AGN_X, TF_AGN_X, 1.5),
    (JAX_AGN, JAX_DP, None),
    (JAX_AGN_X, JAX_DP_X, None),
    (JAX_AGN_X, JAX_AGN, None),
]


# The JAX worker: one process of a launch.


def worker_main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument(WORKER_FLAG, choices=["agn", "data_parallel"])
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    args = parser.parse_args(argv)
    import keras

    keras.distribution.initialize()
    import jax
    import numpy as np

    import keras_clones

    if args.jax_worker == "data_parallel":
        # Each process feeds its own rows of the global batch.
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(auto_shard_dataset=False)
        )
    # This process's rows of every global batch.
    rng = np.random.default_rng(synthetic_mlp.SEED)
    features = synthetic_mlp.NUM_FEATURES
    shape = (args.steps, multiworker.GLOBAL_BATCH, features)
    x = rng.standard_normal(shape, dtype=np.float32)
    w = rng.standard_normal((features, synthetic_mlp.NUM_CLASSES))
    y = np.argmax(x @ w, axis=-1).astype(np.int32)
    mine = slice(jax.process_index() * ROWS, (jax.process_index() + 1) * ROWS)
    x, y = x[:, mine].reshape(-1, features), y[:, mine].reshape(-1)

    model = synthetic_mlp.mlp(keras)
    optimizer = synthetic_mlp.sgd(keras)
    agn = None
    if args.jax_worker == "agn":
        agn = optimizer = keras_clones.AGNOptimizer(optimizer, PERIOD)
    model.compile(
        optimizer,
        "sparse_categorical_crossentropy",
        steps_per_execution=args.steps_per_execution,
    )
    timer = multiworker.step_timer(keras, agn)
    model.fit(
        x,
        y,
        batch_size=ROWS,
        epochs=args.epochs,
        shuffle=False,
        callbacks=[timer],
        verbose=0,
    )
    if jax.process_index() == 0:
        result = multiworker.summarize(
            timer.epochs[1:], PERIOD if agn else 0, args.steps_per_execution
        )
        result["jax"] = jax.__version__
        result["keras"] = keras.__version__
        print(multiworker.RESULT + json.dumps(result), flush=True)


# The driver.


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int)
    parser.add_argument("--steps", type=positive_int)
    parser.add_argument("--epochs", type=positive_int)
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument(
        "--jax-python", default=str(ROOT / ".venv-jax" / "bin" / "python")
    )
    parser.add_argument(
        "--tf-python", default=str(ROOT / ".venv" / "bin" / "python")
    )
    args = parser.parse_args()
    quick = args.quick
    args.repeats = args.repeats or (1 if quick else multiworker.REPEATS)
    args.steps = args.steps or (20 if quick else multiworker.STEPS)
    args.epochs = args.epochs or (2 if quick else multiworker.EPOCHS)
    if args.steps % 10 or args.epochs < 2:
        parser.error("--steps must be a multiple of 10, --epochs at least 2")
    args.evaluate = False  # For `multiworker.throughput_table`.
    return args


def command(name, args):
    """The launch of variant `name`: its command and environment."""
    side, kind, execution = VARIANTS[name]
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # One device per process.
    steps = ["--steps", str(args.steps), "--epochs", str(args.epochs)]
    steps += ["--steps-per-execution", str(execution)]
    launch = [*launching.LAUNCH, "--workers", "2"]
    launch += ["--grace-period", "10"]
    if side == "jax":
        env["KERAS_BACKEND"] = "jax"
        script = [__file__, WORKER_FLAG, kind]
        return [args.jax_python, *launch, *script, *steps], env
    env["KERAS_BACKEND"] = "tensorflow"
    script = [multiworker.__file__, multiworker.WORKER_FLAG, "keras_clones"]
    script += ["--period", str(PERIOD)]
    return [args.tf_python, *launch, *script, *steps], env


def measure(args):
    results = {name: [] for name in VARIANTS}
    for repeat in range(args.repeats):
        for name in VARIANTS:
            argv, env = command(name, args)
            start = time.perf_counter()
            status, lines = launching.run_process(
                argv, multiworker.TIMEOUT, env=env
            )
            prefix = "[worker 0] " + multiworker.RESULT
            result = launching.printed_result(lines, prefix)
            if result is None:
                launching.print_failure(name, status, lines)
                continue
            result.update(repeat=repeat, wall_s=time.perf_counter() - start)
            results[name].append(result)
            print(
                f"repeat {repeat + 1}/{args.repeats}: {name}: "
                f"{result['steps_per_s']:,.1f} steps/s, median step "
                f"{result['median_step_ms']:.2f} ms",
                flush=True,
            )
    return results


def main():
    args = parse_args()
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPU cores.\n")
    start = time.perf_counter()
    results = measure(args)
    print(f"\nWall time {time.perf_counter() - start:.0f} s.\n")
    print(multiworker.throughput_table(results, args))
    print(ratio_table(results, RATIOS, "steps_per_s"))
    return 1 if any(not runs for runs in results.values()) else 0


if __name__ == "__main__":
    if WORKER_FLAG in sys.argv:
        worker_main(sys.argv[1:])
    else:
        sys.exit(main())
