"""One worker of a 2-worker AGNOptimizer run; see tests/test_multi_worker.py.

Each worker trains a CloneModel of 2 clones with AGN(SGD with momentum) at
communication periods 1 and 3 (the default rule), and at period 3 with the
DiLoCo rule and with a bfloat16 all-reduce, and with DiLoCo's overlapped
commits at period 2 (one execution a period), and with 4 fragments at
period 4 and 2 overlapped ones, and in int8 and int4 (int8 also with
2 overlapped fragments and error feedback); the rules differ only in what
each worker commits, which tests/test_agn_rules.py checks by hand in one
process, as tests/test_agn_overlap.py and test_agn_fragments.py do each
rule with overlap and fragments. It saves to
`OUT/agn_worker_<i>.npz` its local weights, global centers, logs and the
batches it was fed. With `--reference` it instead computes, in one process
and by hand, what the workers should hold, from the batches they saved,
once both have (the outer optimizer takes the mean over workers of their
commits), and trains a
plain model with synchronous SGD on the global batch, which period 1 must
equal. It imports the reference from tests/: run it with `PYTHONPATH=tests`.
"""

import os
import time

import keras
import numpy as np
import tensorflow as tf
from common import EPOCHS
from common import GLOBAL_BATCH
from common import clone_model
from common import data
from common import layers
from common import multi_worker_strategy
from common import replayed_on_the_mlp
from common import run
from helpers import recording_quanta
from reference import optimizers

import keras_clones

LEARNING_RATE = 0.05
MOMENTUM = 0.9
WORKERS = 2
# name: (period, AGNOptimizer options, outer SGD (learning rate, momentum,
# nesterov) or None for the default one, a copy of the inner one).
RUNS = {
    "p1": (1, {}, None),
    "p3": (3, {}, None),
    "diloco": (
        3,
        {"commit": "weight_change", "normalize": False},
        (0.7, 0.9, True),
    ),
    "bf16": (3, {"communication_dtype": "bfloat16"}, None),
    "overlap_diloco": (
        2,
        {"overlap": True, "mixing": 0.25, "commit": "weight_change"},
        (0.7, 0.9, True),
    ),
    "overlap_fragments": (
        4,
        {"overlap": True, "fragments": 2, "commit": "weight_change"},
        (0.7, 0.9, True),
    ),
    "fragments_diloco": (
        4,
        {"fragments": 4, "commit": "weight_change", "normalize": False},
        (0.7, 0.9, True),
    ),
    "int8": (3, {"communication_dtype": "int8"}, None),
    "int4_diloco": (
        3,
        {
            "commit": "weight_change",
            "normalize": False,
            "communication_dtype": "int4",
        },
        (0.7, 0.9, True),
    ),
    "int8_overlap_fragments": (
        4,
        {
            "overlap": True,
            "fragments": 2,
            "commit": "weight_change",
            "communication_dtype": "int8",
            "error_feedback": True,
        },
        (0.7, 0.9, True),
    ),
}


def sgd():
    return keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)


def sgd_by_hand():
    return optimizers.SGD(LEARNING_RATE, MOMENTUM)


def dataset():
    return tf.data.Dataset.from_tensor_slices(data()).batch(GLOBAL_BATCH)


def worker(out, index):
    strategy = multi_worker_strategy()
    arrays = {}
    # The batches this worker gets, as `fit` distributes them.
    batches = [
        [strategy.experimental_local_results(t)[0].numpy() for t in batch]
        for batch in strategy.experimental_distribute_dataset(dataset())
    ]
    arrays["x"] = np.stack([x for x, _ in batches])
    arrays["y"] = np.stack([y for _, y in batches])
    for name, (period, options, outer) in RUNS.items():
        with strategy.scope():
            model = clone_model(batch_norm=False, num_clones=2)
            if outer is not None:
                rate, momentum, nesterov = outer
                outer = keras.optimizers.SGD(rate, momentum, nesterov)
            optimizer = keras_clones.AGNOptimizer(
                sgd(), period, outer_optimizer=outer, **options
            )
            # With overlap, an execution spans a fragment's share.
            spe = 1
            if options.get("overlap"):
                spe = period // options.get("fragments", 1)
            model.compile(optimizer, "mse", steps_per_execution=spe)
        phases = []  # After each execution: which path ended the period.
        record = keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: (
                phases.append(optimizer.in_flight_phase.numpy())
                if options.get("overlap")
                else None
            )
        )
        history = model.fit(
            dataset(), epochs=EPOCHS, verbose=0, callbacks=[record]
        ).history
        arrays[f"{name}_rounds"] = np.array(history["communication_rounds"])
        arrays[f"{name}_local_step"] = optimizer.local_step.numpy()
        arrays[f"{name}_bytes_per_round"] = optimizer.bytes_per_round
        if options.get("overlap"):
            arrays[f"{name}_phase"] = optimizer.in_flight_phase.numpy()
            arrays[f"{name}_phases"] = np.array(phases)
        for i, variable in enumerate(model.trainable_weights):
            center = optimizer.global_center_variable(variable)
            arrays[f"{name}_weight_{i}"] = variable.numpy()
            arrays[f"{name}_center_{i}"] = center.numpy()
    # Whole or not at all: the reference, alongside, waits for it.
    path = os.path.join(out, f"agn_worker_{index}.npz")
    np.savez(path + ".partial.npz", **arrays)
    os.replace(path + ".partial.npz", path)


def fed_batches(out, timeout=240.0):
    """The files of both workers, once they are there (the reference runs
    beside the launch)."""
    paths = [os.path.join(out, f"agn_worker_{w}.npz") for w in range(WORKERS)]
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"No workers' batches in {out} in {timeout} s")
        time.sleep(0.5)
    return [np.load(p) for p in paths]


def reference(out):
    fed = fed_batches(out)
    x = np.stack([f["x"] for f in fed])
    y = np.stack([f["y"] for f in fed])
    arrays = {}
    for name, (period, options, outer) in RUNS.items():
        outer_by_hand = outer and (lambda: optimizers.SGD(*outer))
        with recording_quanta() as quanta:
            local, center = replayed_on_the_mlp(
                x, y, period, sgd_by_hand, outer_by_hand, **options
            )
        arrays[f"{name}_quantum"] = quanta[0]
        for i, c in enumerate(center):
            arrays[f"{name}_center_{i}"] = c
        for w in range(WORKERS):
            for i, v in enumerate(local[w]):
                arrays[f"{name}_worker_{w}_weight_{i}"] = v
    plain = keras.Model(*layers(batch_norm=False))
    plain.compile(sgd(), "mse")
    plain.fit(dataset(), epochs=EPOCHS, verbose=0)
    for i, weight in enumerate(plain.get_weights()):
        arrays[f"sync_weight_{i}"] = weight
    np.savez(os.path.join(out, "agn_reference.npz"), **arrays)


if __name__ == "__main__":
    run(worker, reference)
