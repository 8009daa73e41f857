"""The AGN variants trained across JAX processes (agn_variants.py), their
data and model, shared with the test that checks them by hand."""

import keras
import numpy as np
from helpers import RULES
from helpers import LazyMLP
from reference import agn
from reference import models

BATCH, BATCHES, EPOCHS, PERIOD = 8, 12, 1, 4
STEPS = BATCHES * EPOCHS
NAN_BATCH = 1  # Process 1's batch that is a nan, in the "nan" variant.

flat = agn.flat

# name: (AGNOptimizer's options, inner optimizer and by hand, outer
# optimizer (None: the inner one's copy) and by hand). Two rules: what a
# worker commits is each rule's own, checked in one process for every
# rule (tests_jax/test_agn_on_jax.py); across processes, the commits'
# mean is the same for all.
VARIANTS = {name: RULES[name] for name in ("contrib", "diloco")}
_DILOCO = RULES["diloco"]
VARIANTS["diloco_bfloat16"] = (
    dict(_DILOCO[0], communication_dtype="bfloat16"),
    *_DILOCO[1:],
)
VARIANTS["diloco_fragments_overlap"] = (
    dict(_DILOCO[0], fragments=2, overlap=True),
    *_DILOCO[1:],
)
VARIANTS["contrib_fragments"] = (
    dict(RULES["contrib"][0], fragments=2),
    *RULES["contrib"][1:],
)
VARIANTS["contrib_nan"] = RULES["contrib"]
# 8- and 4-bit commits (tests_jax/test_agn_across_processes.py checks them
# at a tolerance of their own).
VARIANTS["diloco_int8"] = (
    dict(_DILOCO[0], communication_dtype="int8"),
    *_DILOCO[1:],
)
VARIANTS["contrib_int4_fragments"] = (
    dict(RULES["contrib"][0], communication_dtype="int4", fragments=2),
    *RULES["contrib"][1:],
)
# Under `ModelParallel` too (`model_parallel`): its blocks of 128 are the
# flattened commit's, as XLA lays the logical arrays out, not a shard's.
VARIANTS["diloco_int8_model_parallel"] = VARIANTS["diloco_int8"]
QUANTIZED = (
    "diloco_int8",
    "contrib_int4_fragments",
    "diloco_int8_model_parallel",
)
VARIANTS["diloco_lazy"] = RULES["diloco"]  # A subclassed model built late.
# A `CloneModel` of 2 clones, a worker of its 2 devices; of 1 clone (the
# default), a worker of 1 device of its process's 2.
VARIANTS["diloco_clones"] = RULES["diloco"]
VARIANTS["diloco_one_clone"] = RULES["diloco"]
CLONES = {"diloco_clones": 2, "diloco_one_clone": 1}
# Under `keras.distribution.ModelParallel` within each worker
# (`model_parallel`): the same rule, its state split as the variables.
VARIANTS["diloco_model_parallel"] = RULES["diloco"]


# The variants also trained at 3 steps per execution (the steps of an
# execution in one program: a scan, its last step apart where it ends a
# period): each schedule of periods and commits once; the others' rules
# differ only in what the period commits, the same at any number.
SCANNED = (
    "contrib",
    "diloco_fragments_overlap",
    "contrib_fragments",
    "contrib_nan",
    "contrib_int4_fragments",
    "bn_uneven",
    "diloco_model_parallel",
)


def executions(name):
    """The `steps_per_execution` variant `name` is trained at."""
    return (1, 3) if name in SCANNED else (1,)


def data(process, nan=False):
    """Process `process`'s own rows; with `nan`, process 1's batch
    `NAN_BATCH` a nan."""
    rng = np.random.default_rng(10 + process)
    x = rng.normal(size=(BATCH * BATCHES, 5)).astype("float32")
    y = np.tanh(x @ np.linspace(-1, 1, 10).reshape(5, 2)).astype("float32")
    if nan and process == 1:
        y[NAN_BATCH * BATCH : (NAN_BATCH + 1) * BATCH] = np.nan
    return x, y


RESUME_BATCHES = 6  # An epoch of 6 steps: the second ends mid-period.


def resume_data(process):
    """Process `process`'s rows of the resumed runs (resume.py)."""
    x, y = data(process)
    rows = RESUME_BATCHES * BATCH
    return x[:rows], y[:rows]


def model_parallel():
    """`keras.distribution.ModelParallel` within this worker: its 2 devices
    as a (1, 2) mesh, the kernels and biases split over "model"."""
    import keras_clones

    mesh = keras.distribution.DeviceMesh(
        (1, 2), ("batch", "model"), devices=keras_clones.worker_devices()
    )
    layouts = keras.distribution.LayoutMap(mesh)
    layouts[".*dense.*kernel"] = (None, "model")
    layouts[".*dense.*bias"] = ("model",)
    return keras.distribution.ModelParallel(
        layout_map=layouts, batch_dim_name="batch", auto_shard_dataset=False
    )


def mlp(seed, lazy=False, clones=0):
    """The variants' model; with `clones`, as a `CloneModel` of that many
    clones."""
    keras.utils.set_random_seed(seed)
    if lazy:
        return LazyMLP()
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(4, activation="tanh"),
            keras.layers.Dense(2),
        ]
    )
    if not clones:
        return model
    import keras_clones

    deployment = keras_clones.DeploymentConfig(num_clones=clones)
    return keras_clones.CloneModel(
        model.inputs, model.outputs, deployment=deployment
    )


# A model with BatchNormalization, its batches of 7 rows uneven over a
# worker's 2 devices, and a period no step ends: each process trains as
# one device on its own rows (bn_uneven).
BN_ROWS = 7


def batch_norm_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(4),
            keras.layers.BatchNormalization(momentum=0.5),
            keras.layers.Activation("tanh"),
            keras.layers.Dense(2),
        ]
    )


def batch_norm_on_one_device(start, processes, steps_per_execution):
    """The weights `batch_norm_model` ends with trained by plain SGD in one
    process on one device on the rows of `processes` (a worker's, in
    order) together, from the weights `start`: what their worker of
    several devices trains locally."""
    own = [data(p) for p in processes]

    def together(field):  # Each step's rows of every process, in order.
        parts = [rows[field] for rows in own]
        starts = range(0, len(parts[0]), BN_ROWS)
        return np.concatenate(
            [part[i : i + BN_ROWS] for i in starts for part in parts]
        )

    x, y = together(0), together(1)
    model = batch_norm_model(0)
    model.set_weights(start)
    model.compile(
        keras.optimizers.SGD(0.1),
        "mse",
        steps_per_execution=steps_per_execution,
    )
    model.fit(
        x, y, batch_size=BN_ROWS * len(processes), shuffle=False, verbose=0
    )
    return model.get_weights()


def _like():
    return [np.zeros(w.shape) for w in mlp(0).get_weights()]


def by_hand(name, start, workers=2, resize=None, processes_per_worker=1):
    """Variant `name` by hand on `workers` workers, each of
    `processes_per_worker` processes whose rows make its batch together,
    from the flat weights `start` (a `Trajectory`); with `resize` (step,
    workers), as resume.py resumes on other workers, on its rows (and
    `processes_per_worker` from that step on: one before)."""
    options, _, hand_inner, _, hand_outer = VARIANTS[name]
    like = _like()
    processes = max(3, (resize or (0, workers))[1] * processes_per_worker)
    rows = [data(p, nan="nan" in name) for p in range(processes)]
    batches, steps = BATCHES, STEPS
    if resize is not None:
        rows = [resume_data(p) for p in range(processes)]
        batches, steps = RESUME_BATCHES, 2 * RESUME_BATCHES

    def gradient(worker, step, weights):
        batch = slice(step % batches * BATCH, (step % batches + 1) * BATCH)
        per_worker = processes_per_worker
        if resize is not None and step < resize[0]:
            per_worker = 1
        own = rows[worker * per_worker : (worker + 1) * per_worker]
        x = np.concatenate([x[batch] for x, _ in own])
        y = np.concatenate([y[batch] for _, y in own])
        weights = agn.unflat(weights, like)
        return flat(models.mlp_mse_gradient(weights, x, y))

    skipped = set()
    if "nan" in name:
        skipped = {(1, e * BATCHES + NAN_BATCH) for e in range(EPOCHS)}
    return agn.agn(
        start,
        gradient,
        steps,
        PERIOD,
        hand_inner,
        hand_outer,
        workers=workers,
        skipped=skipped,
        resize=resize,
        requantized=True,  # Its owner's, in the reduce-scatter form.
        **options,
    )


def mean_loss(trajectory, start, workers=2):
    """The mean squared error of every worker's batches, each at the
    weights it took its step from (`trajectory`'s, from the flat weights
    `start`): what `fit` logs as the epoch's loss."""
    like = _like()
    rows = [data(w) for w in range(workers)]
    losses = []
    for step in range(STEPS):
        for worker in range(workers):
            weights = start
            if step:
                weights = trajectory.history[step - 1][0][worker]
            k1, b1, k2, b2 = agn.unflat(weights, like)
            x, y = rows[worker]
            batch = slice(step % BATCHES * BATCH, (step % BATCHES + 1) * BATCH)
            out = np.tanh(x[batch] @ k1 + b1) @ k2 + b2
            losses.append(np.mean((out - y[batch]) ** 2))
    return np.mean(losses)


def one_process_error(name):
    """How far the variant's recipe lands from AGN by hand in one process
    (here), on process 0's rows: the float32 floor."""
    from keras_clones import AGNOptimizer

    options, inner, _, outer, _ = VARIANTS[name]
    x, y = data(0)
    model = mlp(0)
    start = flat(model.get_weights())
    optimizer = AGNOptimizer(
        inner(), PERIOD, outer_optimizer=outer and outer(), **options
    )
    model.compile(optimizer, "mse")
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    optimizer.apply_in_flight_commit()
    local = by_hand(name.replace("_nan", ""), start, workers=1).local[0]
    return np.abs(flat(model.get_weights()) - local).max()
