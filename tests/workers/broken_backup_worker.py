"""A backup made on 2 workers (resize_worker.py's, of its "gradients" run)
resumed on 2 with worker 1's state file cut short (by resize_worker.py):
every worker fails at once with its error, which it prints with how long
the restore took, and goes on; see tests/test_multi_worker.py."""

import os
import time

import keras
from resize_worker import dataset
from resize_worker import model_for


def worker(out, index):
    model = model_for("gradients")
    backup = keras.callbacks.BackupAndRestore(
        os.path.join(out, "resize_backups", "gradients", "broken")
    )
    started = time.monotonic()
    try:
        model.fit(dataset(), epochs=6, verbose=0, callbacks=[backup])
    except ValueError as e:
        print(f"broken: ValueError: {e}", flush=True)
    else:
        print("broken: no error", flush=True)
    print(f"broken: failed in {time.monotonic() - started:.1f} s", flush=True)
