"""A backup made on 2 workers (resize_worker.py's, of its "gradients" run)
resumed on 2 after the test cut worker 1's state file short: every worker
fails at once; see tests/test_multi_worker.py."""

import os

import keras
from resize_worker import dataset
from resize_worker import model_for


def worker(out, index):
    model = model_for("gradients")
    backup = keras.callbacks.BackupAndRestore(
        os.path.join(out, "resize_backups", "gradients", "broken")
    )
    model.fit(dataset(), epochs=6, verbose=0, callbacks=[backup])
