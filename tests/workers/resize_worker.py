"""A backup made on 2 workers, resumed on 1 and on 3; see
tests/test_multi_worker.py.

On 2 workers (the launch of the scenarios), each of `RUNS` trains a
CloneModel for 3 epochs of 2 steps (global batch 48) with
`BackupAndRestore(delete_checkpoint=False)`, and the chief copies the
backup for each other number of workers. On 1 or 3 workers, each resumes
its copy and trains to epoch 6. Every worker saves the batches it was fed
and, when resumed, its local weights and the centers, to
`OUT/resize_<workers>_<i>.npz`. With `--reference`, one process replays
both phases by hand from the batches fed: synchronous training on the
global batch, and AGN resized as `keras_clones.agn.worker_state` defines
it (the reference's `resize`; in int4, a new worker's residual starts at
zero and a departed worker's is dropped).
"""

import json
import os
import shutil

import keras
import numpy as np
import tensorflow as tf
from common import layers
from common import multi_worker_strategy
from helpers import recording_quanta
from helpers import squared_sum_data
from reference import agn
from reference import models
from reference import optimizers

import keras_clones
from keras_clones.worker_backup import STATE_DIRECTORY

GLOBAL_BATCH = 48
STEPS_PER_EPOCH = 2
BACKED_UP, EPOCHS = 3, 6
RESUMED_ON = (1, 3)
# name: (AGNOptimizer options, or None for synchronous training).
RUNS = {
    "sync": None,
    "gradients": {"communication_period": 4},
    "diloco_overlap": {
        "communication_period": 2,
        "commit": "weight_change",
        "normalize": False,
        "overlap": True,
    },
    "int4_diloco": {
        "communication_period": 4,
        "commit": "weight_change",
        "normalize": False,
        "communication_dtype": "int4",
    },
}


def data():
    return squared_sum_data(GLOBAL_BATCH * STEPS_PER_EPOCH, seed=3)


def dataset():
    return tf.data.Dataset.from_tensor_slices(data()).batch(GLOBAL_BATCH)


def inner():
    return keras.optimizers.SGD(0.02, momentum=0.9)


def outer():
    return keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)


def model_for(run):
    options = RUNS[run]
    with multi_worker_strategy().scope():
        model = keras_clones.CloneModel(*layers(batch_norm=False))
        if options is None:
            model.compile(inner(), "mse")
            return model
        diloco = options.get("commit") == "weight_change"
        optimizer = keras_clones.AGNOptimizer(
            inner(), outer_optimizer=outer() if diloco else None, **options
        )
        spe = options["communication_period"] if options.get("overlap") else 1
        model.compile(optimizer, "mse", steps_per_execution=spe)
    return model


def workers_now():
    return len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])


def fed(strategy):
    """The batches this worker gets in an epoch, as `fit` distributes them."""
    batches = [
        [strategy.experimental_local_results(t)[0].numpy() for t in batch]
        for batch in strategy.experimental_distribute_dataset(dataset())
    ]
    return np.stack([x for x, _ in batches]), np.stack([y for _, y in batches])


def cut_short(backup):
    """Cuts worker 1's state file in `backup` short, for
    broken_backup_worker.py (the next scenarios' collectives wait for this
    worker, so the cut is made before any worker reads it)."""
    state = os.path.join(backup, STATE_DIRECTORY, "step_6.worker_1_of_2.npz")
    with open(state, "rb") as f:
        head = f.read(100)
    with open(state, "wb") as f:
        f.write(head)


def worker(out, index):
    workers = workers_now()
    strategy = multi_worker_strategy()
    x, y = fed(strategy)
    arrays = {"x": x, "y": y}
    for run in RUNS:
        copies = os.path.join(out, "resize_backups", run)
        model = model_for(run)
        if workers == 2:
            backup = keras.callbacks.BackupAndRestore(
                os.path.join(copies, "2"), delete_checkpoint=False
            )
            model.fit(
                dataset(), epochs=BACKED_UP, verbose=0, callbacks=[backup]
            )
            if index == 0:
                for other in (*RESUMED_ON, "broken"):
                    shutil.copytree(
                        os.path.join(copies, "2"),
                        os.path.join(copies, str(other)),
                    )
                if run == "gradients":
                    cut_short(os.path.join(copies, "broken"))
            continue
        backup = keras.callbacks.BackupAndRestore(
            os.path.join(copies, str(workers))
        )
        history = model.fit(
            dataset(), epochs=EPOCHS, verbose=0, callbacks=[backup]
        )
        arrays[f"{run}_epochs"] = len(history.epoch)
        for i, variable in enumerate(model.trainable_weights):
            arrays[f"{run}_weight_{i}"] = variable.numpy()
            if RUNS[run] is not None:
                center = model.optimizer.global_center_variable(variable)
                arrays[f"{run}_center_{i}"] = center.numpy()
    np.savez(os.path.join(out, f"resize_{workers}_{index}.npz"), **arrays)


def reference(out):
    initial = keras.Model(*layers(batch_norm=False)).get_weights()
    arrays = {}
    for after in RESUMED_ON:
        fed = {
            n: [
                np.load(os.path.join(out, f"resize_{n}_{w}.npz"))
                for w in range(n)
            ]
            for n in (2, after)
        }

        def gradient(worker, step, weights, fed=fed, after=after):
            batches = fed[2 if step < BACKED_UP * STEPS_PER_EPOCH else after]
            t = step % STEPS_PER_EPOCH
            weights = agn.unflat(weights, initial)
            grads = models.mlp_mse_gradient(
                weights, batches[worker]["x"][t], batches[worker]["y"][t]
            )
            return agn.flat(grads)

        for run, options in RUNS.items():
            options = dict(options or {"communication_period": 1})
            period = options.pop("communication_period")
            with recording_quanta() as quanta:
                replayed = agn.agn(
                    agn.flat(initial),
                    gradient,
                    EPOCHS * STEPS_PER_EPOCH,
                    period,
                    lambda: optimizers.SGD(0.02, 0.9),
                    (lambda: optimizers.SGD(0.7, 0.9, nesterov=True))
                    if options.get("commit") == "weight_change"
                    else None,
                    workers=2,
                    resize=(BACKED_UP * STEPS_PER_EPOCH, after),
                    **options,
                )
            arrays[f"{after}_{run}_quantum"] = quanta[0]
            if run == "sync":  # Period 1 with SGD is synchronous SGD.
                replayed.center = replayed.local[0]
            for w, local in enumerate(replayed.local):
                for i, v in enumerate(agn.unflat(local, initial)):
                    arrays[f"{after}_{run}_worker_{w}_weight_{i}"] = v
            for i, c in enumerate(agn.unflat(replayed.center, initial)):
                arrays[f"{after}_{run}_center_{i}"] = c
    np.savez(os.path.join(out, "resize_reference.npz"), **arrays)
