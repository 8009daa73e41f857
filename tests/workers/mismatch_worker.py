"""A 2-worker run whose workers disagree three times, then forget the
strategy; see tests/test_multi_worker.py.

`clones`: worker 1 has one clone instead of two. `activation`: worker 1's
hidden layer has another activation (the same weight shapes, so nothing
else would notice). `rows`: worker 1 is given 16 rows fewer (a step
fewer: its collectives would meet the other's next ones).
`outside_scope`: both create the model outside `strategy.scope()`. Both
workers must fail with keras_clones's error each time; they print it, and
go on to the next case.
"""

import contextlib

import keras
from common import data
from common import multi_worker_strategy
from common import task_index

import keras_clones


def train(strategy, mode, odd):
    scope = strategy.scope()
    with contextlib.nullcontext() if mode == "outside_scope" else scope:
        inputs = keras.Input((5,))
        activation = "relu" if odd and mode == "activation" else "tanh"
        hidden = keras.layers.Dense(8, activation=activation)(inputs)
        devices = (
            ["/cpu:0"] if odd and mode == "clones" else ["/cpu:0", "/cpu:1"]
        )
        model = keras_clones.CloneModel(
            inputs,
            keras.layers.Dense(1)(hidden),
            deployment=keras_clones.DeploymentConfig(devices=devices),
        )
        model.compile("sgd", "mse")
    x, y = data()
    rows = len(x) - 16 if odd and mode == "rows" else len(x)
    model.fit(x[:rows], y[:rows], batch_size=16, verbose=0)


def main():
    odd = task_index() == 1
    strategy = multi_worker_strategy()
    for mode in ("clones", "activation", "rows", "outside_scope"):
        try:
            train(strategy, mode, odd)
        except ValueError as e:
            print(f"{mode}: ValueError: {e}", flush=True)
        else:
            print(f"{mode}: no error", flush=True)


if __name__ == "__main__":
    main()
