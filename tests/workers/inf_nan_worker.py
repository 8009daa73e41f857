"""One worker of a 2-worker run with InfNanCheck (tests/test_multi_worker.py).

A nan in one row of the data makes the loss and gradients of whichever
worker gets it non-finite (worker 1's half of the third global batch). With
SGD both workers must skip that step; with AGNOptimizer(period 2) worker 1
skips its local step alone, and the workers count it at the commit. Each
worker saves its weights and logs to `OUT/inf_nan_<i>.npz`; with
`--reference` one process trains the SGD CloneModel, 4 clones on the global
batch, on the data without that batch, and computes AGN's by hand.
"""

import os

import keras
import numpy as np
import tensorflow as tf
from common import EPOCHS
from common import GLOBAL_BATCH
from common import clone_model
from common import data
from common import multi_worker_strategy
from common import replayed_on_the_mlp
from common import run
from reference import optimizers

import keras_clones

NAN_ROW = 2 * GLOBAL_BATCH + GLOBAL_BATCH * 3 // 4  # Worker 1's half.


def train(model, make_optimizer, with_nan, mode="skip"):
    x, y = data()
    if with_nan:
        x[NAN_ROW, 0] = np.nan
    else:  # The reference: the same data without the nan batch.
        keep = np.r_[: 2 * GLOBAL_BATCH, 3 * GLOBAL_BATCH : len(x)]
        x, y = x[keep], y[keep]
    with model.distribute_strategy.scope():
        model.compile(make_optimizer(), "mse")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    callbacks = [keras_clones.callbacks.InfNanCheck(mode)] if with_nan else []
    history = model.fit(dataset, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    return {
        "steps": model.optimizer.iterations.numpy(),
        # An AGNOptimizer's: its skipped local steps count too.
        "local_steps": np.asarray(getattr(model.optimizer, "local_step", -1)),
        "loss": np.array(history.history["loss"]),
        "skipped_steps": np.array(history.history.get("skipped_steps", [])),
        **{f"weight_{i}": w.numpy() for i, w in enumerate(model.weights)},
    }


def sgd():
    return keras.optimizers.SGD(0.05, momentum=0.9)


def agn_sgd():
    return keras_clones.AGNOptimizer(sgd(), communication_period=2)


def agn_sgd_every_step():
    """A period of 1: a skipped step commits nothing, as SGD skips it."""
    return keras_clones.AGNOptimizer(sgd(), communication_period=1)


def worker(out, index):
    strategy = multi_worker_strategy()
    with strategy.scope():
        plain = clone_model(batch_norm=False, num_clones=2)
        agn = clone_model(batch_norm=False, num_clones=2)
        agn_every_step = clone_model(batch_norm=False, num_clones=2)
        stopped = clone_model(batch_norm=False, num_clones=2)
    arrays = {f"sgd_{k}": v for k, v in train(plain, sgd, True).items()}
    for k, v in train(agn, agn_sgd, True).items():
        arrays[f"agn_{k}"] = v
    for k, v in train(agn_every_step, agn_sgd_every_step, True).items():
        arrays[f"agn1_{k}"] = v
    # Worker 1 alone skips step 3 (optimizer step 2); both learn of it at
    # step 4's commit, and print that step's number.
    arrays["agn_stop_steps"] = train(stopped, agn_sgd, True, "stop")["steps"]
    np.savez(os.path.join(out, f"inf_nan_{index}.npz"), **arrays)


def agn_replayed_without_the_nan_step():
    """AGN's weights by hand, worker 1's local step on the nan skipped."""
    x, y = data()
    x[NAN_ROW, 0] = np.nan
    half = GLOBAL_BATCH // 2
    steps = len(x) // GLOBAL_BATCH
    # Each global batch: its first half to worker 0, its second to 1.
    x, y = (a.reshape(steps, 2, half, -1).transpose(1, 0, 2, 3) for a in (x, y))
    nan_step = NAN_ROW // GLOBAL_BATCH
    skipped = {(1, epoch * steps + nan_step) for epoch in range(EPOCHS)}
    local, _ = replayed_on_the_mlp(
        x, y, 2, lambda: optimizers.SGD(0.05, 0.9), skipped=skipped
    )
    return local[0]


def reference(out):
    model = clone_model(batch_norm=False, num_clones=4)
    arrays = {f"sgd_{k}": v for k, v in train(model, sgd, False).items()}
    # AGN(1) trains as the bare optimizer: SGD without the nan batch.
    for name in list(arrays):
        if name.startswith("sgd_weight_"):
            arrays[name.replace("sgd_", "agn1_")] = arrays[name]
    for i, weight in enumerate(agn_replayed_without_the_nan_step()):
        arrays[f"agn_weight_{i}"] = weight
    np.savez(os.path.join(out, "inf_nan_reference.npz"), **arrays)


if __name__ == "__main__":
    run(worker, reference)
