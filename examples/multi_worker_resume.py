"""Two workers, a crash and a resume: the same run as without the crash.

    python examples/multi_worker_resume.py

trains the digits MLP on 2 local workers (`python -m keras_clones.launch`)
with docs/agn.md's DiLoCo recipe (inner AdamW, outer Nesterov SGD, period
8) and `keras.callbacks.BackupAndRestore` twice:

1. uninterrupted;
2. with worker 1 killed (SIGKILL) at optimizer step 30, mid-period, after
   the backup of epoch 1 (step 21), under the launcher's
   `--max-restarts 1`: the launcher stops worker 0 and starts both again,
   and every worker resumes from the backup (the chief's files and each
   worker's own state). Without `--max-restarts` the launch fails, and
   running the same command again resumes the same way.

It prints what the launcher and the resume said, and how far the resumed
run's centers and each worker's local weights are from the uninterrupted
run's (0: the same run), with the held-out accuracies.
"""

import argparse
import os
import pathlib
import signal
import subprocess
import sys
import tempfile

GLOBAL_BATCH = 64
EPOCHS = 4
PERIOD = 8
KILL_AT_STEP = 30


def train(out, kill_at_step):
    """One worker's training (run by the launcher, with TF_CONFIG)."""
    import keras
    import numpy as np
    import tensorflow as tf
    from digits import load_split
    from digits import mlp_layers

    import keras_clones

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    worker = strategy.cluster_resolver.task_id
    x_train, x_test, y_train, y_test = load_split()
    rows = len(x_train) // GLOBAL_BATCH * GLOBAL_BATCH  # 21 steps an epoch.
    dataset = tf.data.Dataset.from_tensor_slices(
        (x_train[:rows], y_train[:rows])
    ).batch(GLOBAL_BATCH)
    with strategy.scope():
        model = keras_clones.CloneModel(*mlp_layers(dropout=0))
        optimizer = keras_clones.AGNOptimizer(
            keras.optimizers.AdamW(3e-3),
            PERIOD,
            commit="weight_change",
            normalize=False,
            outer_optimizer=keras.optimizers.SGD(
                0.7, momentum=0.9, nesterov=True
            ),
        )
        model.compile(optimizer, "sparse_categorical_crossentropy")
    callbacks = [keras.callbacks.BackupAndRestore(os.path.join(out, "backup"))]
    killed = os.path.join(out, "killed")  # Once: a restart goes on.
    if kill_at_step and worker == 1 and not os.path.exists(killed):

        def kill(batch, logs):
            if optimizer.iterations.numpy() == kill_at_step:
                open(killed, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)

        callbacks.append(
            keras.callbacks.LambdaCallback(on_train_batch_begin=kill)
        )
    model.fit(dataset, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    arrays = {}
    for i, variable in enumerate(model.trainable_weights):
        arrays[f"local_{i}"] = variable.numpy()
        arrays[f"center_{i}"] = optimizer.global_center_variable(
            variable
        ).numpy()
    optimizer.assign_global_centers()  # Evaluate the global model.
    predictions = model.predict(x_test, verbose=0).argmax(axis=1)
    arrays["accuracy"] = np.mean(predictions == y_test)
    np.savez(os.path.join(out, f"worker_{worker}.npz"), **arrays)


def launch(out, *options, restarts=0):
    """Runs the 2 workers; returns the launcher's exit code and output."""
    command = [
        sys.executable,
        "-m",
        "keras_clones.launch",
        "--workers",
        "2",
        "--grace-period",
        "0",
        "--max-restarts",
        str(restarts),
        __file__,
        "--worker",
        "--out",
        str(out),
        *options,
    ]
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=600
    )
    return result.returncode, result.stdout + result.stderr


def said(output, *marks):
    """The lines of `output` that hold one of `marks`."""
    return [
        line for line in output.splitlines() if any(m in line for m in marks)
    ]


def main(work):
    uninterrupted, restarted = work / "uninterrupted", work / "restarted"
    print(
        f"1/2: training {EPOCHS} epochs on 2 workers, uninterrupted (about "
        "30 s)...",
        flush=True,
    )
    code, output = launch(uninterrupted)
    if code:
        sys.exit(f"The uninterrupted run failed:\n{output[-3000:]}")
    print(
        f"2/2: the same, worker 1 killed at optimizer step {KILL_AT_STEP} "
        "and the launch restarted from the backup (about 40 s)...",
        flush=True,
    )
    code, output = launch(
        restarted, "--kill-at-step", str(KILL_AT_STEP), restarts=1
    )
    if code:
        sys.exit(f"The restarted run failed:\n{output[-3000:]}")
    print(
        f"Worker 1 killed at optimizer step {KILL_AT_STEP} under "
        f"--max-restarts 1: the launch exits with code {code}."
    )
    marks = ("keras_clones.launch: ", "keras_clones: resumed", "training again")
    for line in said(output, *marks):
        print(f"  {line}")
    compare(uninterrupted, restarted, "resumed")


def compare(uninterrupted, other, name):
    """Prints how far `other`'s run is from the uninterrupted one."""
    import numpy as np

    for worker in range(2):
        a = np.load(uninterrupted / f"worker_{worker}.npz")
        b = np.load(other / f"worker_{worker}.npz")
        local = max(
            np.abs(a[k] - b[k]).max() for k in a.files if k.startswith("local")
        )
        center = max(
            np.abs(a[k] - b[k]).max() for k in a.files if k.startswith("center")
        )
        print(
            f"Worker {worker}: {name} - uninterrupted, largest difference: "
            f"local weights {local:.1e}, centers {center:.1e}; held-out "
            f"accuracy {float(b['accuracy']):.4f} (uninterrupted "
            f"{float(a['accuracy']):.4f})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", type=pathlib.Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--kill-at-step", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        train(args.out, args.kill_at_step)
    elif args.work_dir:
        main(args.work_dir)
    else:
        with tempfile.TemporaryDirectory() as work:
            main(pathlib.Path(work))
