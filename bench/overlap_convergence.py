"""Does DiLoCo with overlapped commits converge as DiLoCo does?

Issue 62: the README's DiLoCo recipe (inner AdamW 1e-3, period 8, outer
SGD(0.7, momentum=0.9, nesterov=True), `weight_change`, undivided) with
`overlap=True`, on the digits (64-128-10 MLP, batch 32 per process, 6
epochs, 3 seeds), against the same recipe without overlap: in one process
on TensorFlow, in one process on JAX, and across 2 JAX processes (each
process its own half of the rows). Converges: the mean held-out accuracy
of the global centers is within 0.02 of the run without overlap, and no
seed's last-epoch loss is above its second epoch's. What and how:
docs/agn.md#overlapped-commits.

    python bench/overlap_convergence.py [--quick] [--seeds S [S ...]]
        [--jax-python PATH] [--out DIR] [--from-json PATH]

Run it with the TensorFlow venv (`.venv`, which has scikit-learn, for the
digits); the JAX parts run with `--jax-python` (default `.venv-jax`'s).
"""

import json
import os
import statistics
import sys

import harness
import launching

PERIOD, BATCH, EPOCHS, WORKERS = 8, 32, 6, 2
QUICK_EPOCHS = 2
TIMEOUT = 1800
# name: the overlap arguments of `AGNOptimizer` (None: no overlap).
VARIANTS = {
    "without overlap": None,
    "overlap (mixing 0.5, the default)": {"overlap": True},
    "overlap, mixing 0": {"overlap": True, "mixing": 0.0},
}
WITHOUT = "without overlap"
# name: (backend, processes: None for one, without the launcher).
SETTINGS = {
    "TensorFlow, one process": ("tensorflow", None),
    "JAX, one process": ("jax", None),
    "JAX, 2 processes": ("jax", WORKERS),
}
ACCURACY_GAP = 0.02
FLAGS = [
    harness.Flag("--seeds", [0, 1, 2], quick=[0], type=int, help="seeds"),
    harness.Flag(
        "--jax-python",
        str(harness.ROOT / ".venv-jax" / "bin" / "python"),
        help="the Python of the JAX parts",
    ),
]


# A run: in a child process (one process) or each launched JAX process.


def worker(argv):
    settings = launching.worker_settings(argv)
    import keras

    if settings.processes:
        keras.distribution.initialize()  # Before any other Keras object.
    records = [
        train(settings, name, seed)
        for name in VARIANTS
        for seed in settings.seeds
    ]
    if keras.backend.backend() != "jax" or _process_index() == 0:
        print(launching.RESULT + json.dumps(records), flush=True)


def _process_index():
    import jax

    return jax.process_index()


def train(settings, name, seed):
    """One run of variant `name`: its loss per epoch, and the held-out
    accuracy of the global centers."""
    import keras
    import numpy as np

    import keras_clones

    data = np.load(settings.data)
    x, y = data["x_train"], data["y_train"]
    if settings.processes:  # This process's rows, as many on each.
        index, count = _process_index(), settings.processes
        mine = slice(index, len(x) // count * count, count)
        x, y = x[mine], y[mine]
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((64,))
    hidden = keras.layers.Dense(128, activation="relu")(inputs)
    hidden = keras.layers.Dropout(0.2)(hidden)
    outputs = keras.layers.Dense(10, activation="softmax")(hidden)
    model = keras.Model(inputs, outputs)
    optimizer = keras_clones.AGNOptimizer(
        keras.optimizers.AdamW(1e-3),
        communication_period=PERIOD,
        outer_optimizer=keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True),
        commit="weight_change",
        normalize=False,
        **(VARIANTS[name] or {}),
    )
    model.compile(optimizer, "sparse_categorical_crossentropy")
    history = model.fit(
        x, y, batch_size=BATCH, epochs=settings.epochs, verbose=0
    )
    optimizer.assign_global_centers()
    kernel, bias, out_kernel, out_bias = model.get_weights()
    hidden = np.maximum(data["x_test"] @ kernel + bias, 0.0)
    predicted = (hidden @ out_kernel + out_bias).argmax(axis=1)
    accuracy = float(np.mean(predicted == data["y_test"]))
    return {
        "variant": name,
        "seed": seed,
        "loss": [float(v) for v in history.history["loss"]],
        "accuracy": accuracy,
    }


# The driver.


def digits(out):
    """The digits' fixed 75/25 split (examples/digits.py's), saved where
    every part reads it; its path."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    loaded = load_digits()
    x = (loaded.data / 16.0).astype("float32")
    x_train, x_test, y_train, y_test = train_test_split(
        x, loaded.target, test_size=0.25, random_state=0
    )
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "overlap_convergence_digits.npz")
    np.savez(
        path, x_train=x_train, x_test=x_test, y_train=y_train, y_test=y_test
    )
    return path


def measure(args):
    """Per setting, the records of its runs; None if a part failed."""
    path = digits(args.out)
    epochs = QUICK_EPOCHS if args.quick else EPOCHS
    data = {"epochs": epochs, "records": {}}
    for setting, (backend, processes) in SETTINGS.items():
        python = sys.executable if backend == "tensorflow" else args.jax_python
        arguments = launching.worker_arguments(
            __file__,
            data=path,
            seeds=args.seeds,
            epochs=epochs,
            processes=processes,
        )
        env = dict(os.environ, KERAS_BACKEND=backend)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env.pop("XLA_FLAGS", None)  # One device per process.
        print(f"{setting}...", flush=True)
        records = launching.chief_result(
            processes, arguments, TIMEOUT, setting, env=env, python=python
        )
        if records is None:
            return None
        data["records"][setting] = records
    return data


def verdicts(records):
    """Per variant of one setting's `records`: the mean held-out accuracy,
    its gap to the run without overlap, the largest last-epoch loss over
    the second's, and whether it converges (within `ACCURACY_GAP`, and no
    seed's last-epoch loss above its second epoch's)."""
    result = {}
    for name in VARIANTS:
        runs = [r for r in records if r["variant"] == name]
        if not runs:
            continue
        accuracy = statistics.mean(r["accuracy"] for r in runs)
        result[name] = {
            "accuracy": accuracy,
            "seeds": [r["accuracy"] for r in runs],
            "rise": max(r["loss"][-1] - r["loss"][1] for r in runs),
        }
    base = result[WITHOUT]["accuracy"]
    for row in result.values():
        row["gap"] = base - row["accuracy"]
        within = row["gap"] <= ACCURACY_GAP + 1e-9  # Float sums' rounding.
        row["converges"] = within and row["rise"] <= 0
    return result


def report(data, args):
    rows = []
    missed = []
    for setting, records in data["records"].items():
        for name, row in verdicts(records).items():
            seeds = " ".join(f"{a:.4f}" for a in row["seeds"])
            rows.append(
                [
                    setting,
                    name,
                    f"{row['accuracy']:.4f} ({seeds})",
                    f"{row['gap']:+.4f}",
                    f"{row['rise']:+.3f}",
                    "yes" if row["converges"] else "**no**",
                ]
            )
            if not row["converges"] and name != WITHOUT:
                missed.append(f"{setting}: {name}")
    print(
        "\n"
        + harness.table(
            [
                "setting",
                "variant",
                "held-out accuracy, mean (seeds)",
                "below without overlap",
                "last-epoch loss - second's, largest",
                "converges",
            ],
            rows,
            align="llllll",
        ),
        end="",
    )
    goal = "met" if not missed else "MISSED (" + "; ".join(missed) + ")"
    print(
        f"\nGoal (every overlapped variant within {ACCURACY_GAP} of the run "
        f"without overlap, its loss at epoch {data['epochs']} at most its "
        f"second epoch's, in every setting): {goal}."
    )


BENCHMARK = harness.Benchmark(
    __doc__,
    measure,
    report,
    flags=FLAGS,
    quick=f"seed 0, {QUICK_EPOCHS} epochs (a smoke test)",
    record="overlap_convergence.json",
    worker=worker,
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
