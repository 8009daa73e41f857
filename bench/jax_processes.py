"""AGN across JAX processes against AGN across TensorFlow workers, and
against `keras.distribution.DataParallel` across the same processes.

`fit` steps/s of `bench/multiworker.py`'s task on 2 local processes: AGN(10)
and DataParallel on Keras's JAX backend, AGN(10) on 2 TensorFlow workers,
each at 1 and 10 steps per execution; AGN(10) at 10 on 2 processes of 2
devices each (the same per-process batch). What and how:
docs/benchmarks/workers.md#jax_processes.

    python bench/jax_processes.py [--quick] [--repeats R] [--steps S]
                                  [--epochs E]
"""

import json
import os
import sys

import harness
import launching
import multiworker

ROWS = multiworker.GLOBAL_BATCH // 2  # Per process and step.
PERIOD = 10
FLAGS = multiworker.FLAGS[:3] + [
    harness.Flag(
        "--jax-python",
        str(harness.ROOT / ".venv-jax" / "bin" / "python"),
        help="the Python of the JAX processes",
    ),
    harness.Flag(
        "--tf-python",
        str(harness.ROOT / ".venv" / "bin" / "python"),
        help="the Python of the TensorFlow workers",
    ),
]

JAX_AGN, JAX_AGN_X = "JAX AGN(10) 2p", "JAX AGN(10) 2p x10"
JAX_AGN_2D_X = "JAX AGN(10) 2p of 2 devices x10"
JAX_DP, JAX_DP_X = "JAX DataParallel 2p", "JAX DataParallel 2p x10"
TF_AGN, TF_AGN_X = "TF AGN(10) 2w", "TF AGN(10) 2w x10"
# name: (side, JAX worker kind, steps per execution, devices per process)
VARIANTS = {
    JAX_AGN: ("jax", "agn", 1, 1),
    JAX_AGN_X: ("jax", "agn", 10, 1),
    JAX_AGN_2D_X: ("jax", "agn", 10, 2),
    JAX_DP: ("jax", "data_parallel", 1, 1),
    JAX_DP_X: ("jax", "data_parallel", 10, 1),
    TF_AGN: ("tf", None, 1, 1),
    TF_AGN_X: ("tf", None, 10, 1),
}
RATIOS = [
    (JAX_AGN, TF_AGN, 1.5),
    (JAX_AGN_X, TF_AGN_X, 1.5),
    (JAX_AGN, JAX_DP, None),
    (JAX_AGN_X, JAX_DP_X, None),
    (JAX_AGN_X, JAX_AGN, None),
    # A worker of 2 devices (host devices here, sharing the 2 cores: the
    # step's split and its local all-reduce cost, no speed to gain).
    (JAX_AGN_2D_X, JAX_AGN_X, None),
]


def worker(argv):
    """One JAX process of a launch; process 0 prints the result."""
    run = launching.worker_settings(argv)
    import keras

    keras.distribution.initialize()
    import jax
    import numpy as np

    import keras_clones

    if run.kind == "data_parallel":
        # Each process feeds its own rows of the global batch.
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(auto_shard_dataset=False)
        )
    # This process's rows of every global batch.
    rng = np.random.default_rng(multiworker.SEED)
    features = multiworker.NUM_FEATURES
    shape = (run.steps, multiworker.GLOBAL_BATCH, features)
    x = rng.standard_normal(shape, dtype=np.float32)
    w = rng.standard_normal((features, multiworker.NUM_CLASSES))
    y = np.argmax(x @ w, axis=-1).astype(np.int32)
    mine = slice(jax.process_index() * ROWS, (jax.process_index() + 1) * ROWS)
    x, y = x[:, mine].reshape(-1, features), y[:, mine].reshape(-1)

    period = PERIOD if run.kind == "agn" else 0
    model = multiworker.compiled(keras, keras_clones, period, run.execution)
    timer = multiworker.step_timer(keras, model.optimizer if period else None)
    model.fit(
        x,
        y,
        batch_size=ROWS,
        epochs=run.epochs,
        shuffle=False,
        callbacks=[timer],
        verbose=0,
    )
    if jax.process_index() == 0:
        result = multiworker.summarize(timer.runs[1:], period, run.execution)
        where = os.path.dirname(keras_clones.__file__)
        result["versions"] = (
            f"JAX {jax.__version__}, Keras {keras.__version__}, from {where}"
        )
        print(launching.RESULT + json.dumps(result), flush=True)


def measure(args):
    """Round-robin launches of 2 processes; per variant the chief results."""
    if args.steps % 10 or args.epochs < 2:
        sys.exit("--steps must be a multiple of 10, --epochs >= 2")
    args.evaluate = False  # For `multiworker.throughput_table`.

    def launch(name, repeat):
        side, kind, execution, devices = VARIANTS[name]
        env = dict(os.environ)
        env.pop("XLA_FLAGS", None)  # One device per process, or:
        if devices > 1:
            flag = f"--xla_force_host_platform_device_count={devices}"
            env["XLA_FLAGS"] = flag
        env["KERAS_BACKEND"] = "jax" if side == "jax" else "tensorflow"
        steps = dict(steps=args.steps, epochs=args.epochs, execution=execution)
        if side == "jax":
            script = launching.worker_arguments(__file__, kind=kind, **steps)
        else:  # `bench/multiworker.py`'s AGN(10) 2w.
            script = launching.worker_arguments(
                multiworker.__file__,
                kind="keras_clones",
                period=PERIOD,
                evaluate=False,
                **steps,
            )
        python = args.jax_python if side == "jax" else args.tf_python
        return launching.chief_result(
            2, script, multiworker.TIMEOUT, name, env=env, python=python
        )

    return launching.round_robin(
        list(VARIANTS),
        launch,
        args.repeats,
        "steps_per_s",
        "steps/s",
        kind=lambda name: VARIANTS[name][0],
    )


def report(results, args):
    print(multiworker.throughput_table(results, args))
    print(harness.ratio_table(results, RATIOS, "steps_per_s"))
    harness.exit_if_any_failed(results)


BENCHMARK = harness.Benchmark(
    __doc__, measure, report, flags=FLAGS, worker=worker
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
