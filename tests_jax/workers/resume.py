"""DiLoCo across JAX processes under `keras.callbacks.BackupAndRestore`, as
a user's script runs it. tests_jax/test_agn_across_processes.py launches
it: interrupted after its first epoch (6 steps: mid-period), then resumed
on 1, 2 or 3 processes, and killed mid-epoch under `--max-restarts 1`.

`resume.py OUT BACKUP MODE`: MODE "interrupted" stops as the second epoch
begins; "resumed" trains to the end; "killed" has process 1 kill itself
in the second epoch the first time (a file in OUT remembers), then trains
to the end. At the end each process writes `OUT/resumed.PROCESS.npz`.
"""

import os
import signal
import sys

import keras

keras.distribution.initialize()  # Before any other Keras object.

import jax  # noqa: E402
import numpy as np  # noqa: E402
import variants  # noqa: E402
from helpers import InterruptAtEpoch  # noqa: E402

from keras_clones import AGNOptimizer  # noqa: E402

PROCESS = jax.process_index()


class KillOnce(keras.callbacks.Callback):
    """Process 1 kills itself after batch 2 of the second epoch, once."""

    def __init__(self, marker):
        super().__init__()
        self.marker = marker
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (PROCESS, self.epoch, batch) == (1, 1, 2):
            if not os.path.exists(self.marker):
                open(self.marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)


def main():
    out, backup, mode = sys.argv[1:4]
    options, inner, _, outer, _ = variants.VARIANTS["diloco"]
    x, y = variants.resume_data(PROCESS)
    model = variants.mlp(seed=PROCESS)
    optimizer = AGNOptimizer(
        inner(), variants.PERIOD, outer_optimizer=outer(), **options
    )
    model.compile(optimizer, "mse")
    callbacks = [keras.callbacks.BackupAndRestore(backup)]
    if mode == "interrupted":
        callbacks.append(InterruptAtEpoch(1))
    if mode == "killed":
        callbacks.append(KillOnce(os.path.join(out, "killed")))
    try:
        model.fit(
            x,
            y,
            batch_size=variants.BATCH,
            epochs=2,
            shuffle=False,
            callbacks=callbacks,
            verbose=0,
        )
    except RuntimeError as error:
        if mode == "interrupted" and str(error) == "interrupted":
            return
        raise
    centers = [
        optimizer.global_center_variable(v) for v in model.trainable_variables
    ]
    np.savez(
        f"{out}/resumed.{PROCESS}.npz",
        local=variants.flat(model.get_weights()),
        center=variants.flat([np.asarray(c) for c in centers]),
        iterations=int(optimizer.iterations.numpy()),
    )


if __name__ == "__main__":
    main()
