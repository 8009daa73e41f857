"""What tells a launched task where it stands in its cluster: Keras's
`KERAS_DISTRIBUTION_*` variables for workers on JAX, `TF_CONFIG` for
TensorFlow's. Standard library only, as the launcher.
"""

import json
import os


def keras_backend():
    """The Keras backend the workers will run, found as Keras finds it:
    `KERAS_BACKEND`, else `backend` in `$KERAS_HOME/keras.json` (by default
    `~/.keras/keras.json`), else "tensorflow"."""
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME") or os.path.join(
        os.path.expanduser("~"), ".keras"
    )
    try:
        with open(os.path.join(home, "keras.json")) as f:
            return json.load(f).get("backend", "tensorflow")
    except (OSError, ValueError):
        return "tensorflow"


# How many consecutive JAX processes make one worker
# (`keras_clones.replicas.worker_axis.PROCESSES_PER_WORKER`).
PROCESSES_PER_WORKER = "KERAS_CLONES_PROCESSES_PER_WORKER"


def task_environment(cluster, task, processes_per_worker=1):
    """What tells task `(type, index)` of `cluster` where it stands: on
    JAX, Keras's `KERAS_DISTRIBUTION_*` variables, which
    `keras.distribution.initialize()` reads, and `PROCESSES_PER_WORKER`;
    else `TF_CONFIG`."""
    kind, index = task
    if keras_backend() == "jax":
        return {
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": ",".join(cluster["worker"]),
            "KERAS_DISTRIBUTION_NUM_PROCESSES": str(len(cluster["worker"])),
            "KERAS_DISTRIBUTION_PROCESS_ID": str(index),
            PROCESSES_PER_WORKER: str(processes_per_worker),
        }
    tf_config = {"cluster": cluster, "task": {"type": kind, "index": index}}
    return {"TF_CONFIG": json.dumps(tf_config)}
