"""A 2-worker run in which worker 1 dies or stalls mid-epoch; see
tests/test_multi_worker.py.

`kill`: worker 1 kills itself with SIGKILL. `stall`: worker 1 sleeps, and
the strategy's collectives time out after `TIMEOUT` seconds. Worker 0 must
fail by itself, with keras_clones's error, and prints how long it waited.
"""

import os
import signal
import sys
import time

import keras
import tensorflow as tf
from common import clone_model
from common import data
from common import task_index

# Long enough for a worker busy tracing its first step while the other
# waits in a collective (the test runs beside nothing, `alone`: the two
# start within a second of each other); the stall waits this long.
TIMEOUT = 10.0


class LoseWorker(keras.callbacks.Callback):
    def __init__(self, index, mode):
        super().__init__()
        self.index, self.mode = index, mode

    def on_train_batch_end(self, batch, logs=None):
        if batch == 5:
            print(f"batch 5 done at {time.time()}", flush=True)
            if self.index == 1 and self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.index == 1 and self.mode == "stall":
                # Stopped by SIGTERM at once: TensorFlow's handler holds it
                # up, and the launcher's SIGKILL 5 s later is
                # tests/test_launch.py's.
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                time.sleep(600)


def main(mode):
    index = task_index()
    options = None
    if mode == "stall":
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=TIMEOUT
        )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=options
    )
    with strategy.scope():
        model = clone_model(batch_norm=False, num_clones=2)
        model.compile("sgd", "mse")
    x, y = data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(4)
    try:
        model.fit(
            dataset,
            epochs=1,
            steps_per_epoch=1000,
            verbose=0,
            callbacks=[LoseWorker(index, mode)],
        )
    finally:
        print(f"failed at {time.time()}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
