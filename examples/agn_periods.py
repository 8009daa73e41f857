"""AGN at several communication periods against synchronous training.

Trains one MLP on scikit-learn's `load_digits` (a fixed, stratified 75/25
train/test split, inputs standardized on the training set) for the same
number of epochs, from the same initial weights and over the same batches,
with the bare Adam optimizer (synchronous: every step communicates) and with
`AGNOptimizer(Adam, communication_period=p)` for each period p. After every
epoch it records the held-out accuracy of the global model and the
communication rounds so far (`local_step // p`, or the steps taken for the
synchronous run), prints a table of the final accuracies and saves a PNG
with accuracy against epochs and against communication rounds.

The global model is evaluated in place, not as a clone: the model's (local)
weights are copied aside, `assign_global_centers()` writes the centers into
the model, the test set is scored, and the local weights are restored, so
that training continues exactly as if nothing had been evaluated.

With one worker, AGN takes one outer step per period (with the mean of the
period's gradients), so its global model makes p times fewer steps than
synchronous training. The learning rate (1e-2) lets synchronous training
plateau within a few epochs, so that the larger periods can catch up within
the epoch budget.

Usage:
    python examples/agn_periods.py [--epochs N] [--periods P [P ...]]
                                   [--output agn_periods.png]
"""

import argparse
import dataclasses
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from keras_clones import AGNOptimizer  # noqa: E402

SEED = 0
BATCH_SIZE = 32
LEARNING_RATE = 1e-2


@dataclasses.dataclass
class Run:
    """One training run: `period` is None for synchronous training."""

    period: int | None
    accuracy: list = dataclasses.field(default_factory=list)
    rounds: list = dataclasses.field(default_factory=list)

    @property
    def label(self):
        return "synchronous" if self.period is None else f"AGN p={self.period}"


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--epochs",
        type=positive_int,
        default=30,
        help="epochs of every run (default 30)",
    )
    parser.add_argument(
        "--periods",
        type=positive_int,
        nargs="+",
        default=[1, 4, 16, 64],
        help="AGN communication periods (default 1 4 16 64)",
    )
    parser.add_argument(
        "--output",
        default="agn_periods.png",
        help="where to save the plot (default agn_periods.png)",
    )
    return parser.parse_args(argv)


def pyplot():
    """matplotlib's pyplot on the Agg backend, imported only when plotting."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(
            "This example plots with matplotlib, which is not installed: "
            "pip install 'keras_clones[tensorflow,examples]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load_data():
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data,
        digits.target,
        test_size=0.25,
        random_state=SEED,
        stratify=digits.target,
    )
    scaler = StandardScaler().fit(x_train)
    x_train = scaler.transform(x_train).astype("float32")
    x_test = scaler.transform(x_test).astype("float32")
    return x_train, y_train, x_test, y_test


def mlp():
    inputs = keras.Input((64,))
    x = keras.layers.Dense(128, activation="relu")(inputs)
    outputs = keras.layers.Dense(10, activation="softmax")(x)
    return keras.Model(inputs, outputs)


class GlobalModelAccuracy(keras.callbacks.Callback):
    """Appends the global model's held-out accuracy and rounds to `run`."""

    def __init__(self, run, x_test, y_test):
        super().__init__()
        self.run = run
        self.x_test = x_test
        self.y_test = y_test

    def on_epoch_end(self, epoch, logs=None):
        optimizer = self.model.optimizer
        if self.run.period is None:
            self.run.accuracy.append(self.accuracy())
            self.run.rounds.append(int(optimizer.iterations.numpy()))
            return
        local_weights = self.model.get_weights()
        optimizer.assign_global_centers()
        self.run.accuracy.append(self.accuracy())
        self.model.set_weights(local_weights)
        self.run.rounds.append(
            int(optimizer.local_step.numpy()) // self.run.period
        )

    def accuracy(self):
        probabilities = self.model(self.x_test, training=False)
        predictions = np.argmax(probabilities, axis=-1)
        return float(np.mean(predictions == self.y_test))


def train(run, data, weights, epochs):
    """Trains one run from `weights`, with the same batches as every run."""
    x_train, y_train, x_test, y_test = data
    optimizer = keras.optimizers.Adam(LEARNING_RATE)
    if run.period is not None:
        optimizer = AGNOptimizer(optimizer, communication_period=run.period)
    model = mlp()
    model.set_weights(weights)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    keras.utils.set_random_seed(SEED)  # The same shuffles for every run.
    model.fit(
        x_train,
        y_train,
        batch_size=BATCH_SIZE,
        epochs=epochs,
        callbacks=[GlobalModelAccuracy(run, x_test, y_test)],
        verbose=0,
    )
    return run


def format_table(runs):
    sync = runs[0].accuracy[-1]
    lines = [
        "| period | held-out accuracy | vs synchronous (points) | rounds |",
        "|---|---:|---:|---:|",
    ]
    for run in runs:
        period = "synchronous" if run.period is None else run.period
        points = 100 * (run.accuracy[-1] - sync)
        lines.append(
            f"| {period} | {run.accuracy[-1]:.4f} | {points:+.1f} | "
            f"{run.rounds[-1]:,} |"
        )
    return "\n".join(lines)


def save_plot(runs, path, plt):
    figure, (by_epoch, by_round) = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        # Dashed on top: AGN with period 1 would hide it otherwise.
        style = {"color": "black", "linestyle": "--", "zorder": 3}
        style = style if run.period is None else {}
        epochs = range(1, len(run.accuracy) + 1)
        by_epoch.plot(epochs, run.accuracy, label=run.label, **style)
        # A log axis cannot show the epochs before the first round.
        points = [(r, a) for r, a in zip(run.rounds, run.accuracy) if r > 0]
        by_round.plot(*zip(*points), label=run.label, **style)
    by_epoch.set(xlabel="epoch", ylabel="held-out accuracy")
    by_round.set(xlabel="communication rounds", xscale="log")
    for axes in (by_epoch, by_round):
        axes.set_ylim(0, 1)
        axes.grid(alpha=0.3)
    by_epoch.legend(loc="lower right")
    figure.suptitle("load_digits MLP: AGN periods against synchronous Adam")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv=None):
    """Runs the comparison; returns the runs, synchronous first."""
    args = parse_args(argv)
    plt = pyplot()  # Fails before training if matplotlib is missing.
    data = load_data()
    keras.utils.set_random_seed(SEED)
    weights = mlp().get_weights()
    runs = [Run(period) for period in [None, *args.periods]]
    for run in runs:
        train(run, data, weights, args.epochs)
        print(f"{run.label}: {run.accuracy[-1]:.4f}", flush=True)
    print(f"\nAfter {args.epochs} epochs (batch {BATCH_SIZE}):\n")
    print(format_table(runs))
    save_plot(runs, args.output, plt)
    print(f"\nSaved {args.output}")
    return runs


if __name__ == "__main__":
    main()
