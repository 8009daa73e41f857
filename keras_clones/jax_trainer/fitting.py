"""Keras's `fit` across JAX processes, for a model compiled with an
`AGNOptimizer`: what keras_clones changes in Keras's JAX trainer, and
when.

A script started as several processes calls
`keras.distribution.initialize()` first (as under `keras.distribution`),
then compiles and fits a plain `keras.Model` on its own rows. When JAX
runs several processes, no `keras.distribution` is set and the optimizer
is (or wraps) an `AGNOptimizer`, `fit`:

- refuses, on every process, before Keras's `fit` and any callback,
  processes that do not agree on the model and its compilation (the
  optimizer's configuration included), naming what differs and where
  (`check_same_model`);
- trains with the train function of `train_function.make`: each process
  takes its own local steps, and the AGN commits are averaged over the
  processes;
- shows the progress bar on process 0 alone under `verbose="auto"`;
- agrees, through `ProcessAgreement` (a callback it adds last): at the
  start, on the steps of an epoch (refused where they differ); in a run
  that has taken no step, on process 0's weights and optimizer state; at
  a period's end (where `PostInitCopy` copies weights set since into the
  centers), on process 0's weights and centers;
  after every epoch, on `stop_training` (a stop on any process stops
  every process). Within an epoch the logs agree, so a callback that stops
  from them (`TerminateOnNaN`, `InfNanCheck`) stops every process at the
  same step;
- logs, as `evaluate` returns, every metric's result from its state
  summed over the processes; on a worker of several CPU devices,
  `evaluate` and `predict` take their steps one at a time
  (`_one_step_in_flight`);
- writes files once: `model.save` and `save_weights` (and so
  `ModelCheckpoint`) write on process 0 alone, `CSVLogger` and
  `TensorBoard` run there alone, and `keras.callbacks.BackupAndRestore`
  runs on every process as `backup.ProcessBackup`: process 0 writes
  Keras's backup, each process its own state beside it.

In one process as across them, `fit` and `train_on_batch` with an
`AGNOptimizer` copy the model into its centers before their first step
rather than in every step (`keras_clones.jax_trainer.first_step`).

`keras_clones.jax_trainer.overrides` puts these functions in
Keras's `JAXTrainer`; each calls Keras's own where it does not act.
"""

import inspect
import os
import sys
import weakref

import jax
import keras
import numpy as np

from keras_clones import _keras_internals as internals
from keras_clones import gradients
from keras_clones.agn.optimizer import agn_of
from keras_clones.clone_model import jax_devices
from keras_clones.jax_processes import backup
from keras_clones.jax_processes import exits
from keras_clones.jax_processes.workers import Workers
from keras_clones.jax_processes.workers import worker_devices
from keras_clones.jax_trainer import first_step
from keras_clones.jax_trainer import period_programs
from keras_clones.jax_trainer import steps_in_flight
from keras_clones.jax_trainer import train_function
from keras_clones.multi_worker import description
from keras_clones.replicas import worker_axis

NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
_WORKERS = []  # This run's `Workers`, made once.
# The models `fit` has trained across the processes: their state between
# executions is global (`jax_state_sync`).
_ACROSS = weakref.WeakSet()
# A model's program of `metrics_result_or_logs`, with the metrics' variables
# it was made for.
_evaluation_logs = weakref.WeakKeyDictionary()


def workers(model=None):
    """This run's `Workers` (made on first use), laid out by the
    `keras.distribution` in effect (none, or one within each worker), a
    worker `model`'s `worker_devices()` of each process where it has them
    (a `CloneModel`'s clones, by Keras's names), else all of them."""
    distribution = keras.distribution.distribution()
    devices = None
    if hasattr(model, "worker_devices"):  # A `CloneModel`'s, by name.
        devices = jax_devices.local_devices_named(model.worker_devices())
    made = _WORKERS[0] if _WORKERS else None
    if (
        made is None
        or made.distribution is not distribution
        or not made.of_devices(devices)
    ):
        _WORKERS[:] = [Workers(distribution, devices)]
    return _WORKERS[0]


def check_processes_started():
    """Refuses a process started as one of several whose JAX runs alone
    (the script did not call `keras.distribution.initialize()`), and
    processes that `worker_axis.PROCESSES_PER_WORKER` cannot group."""
    worker_axis.processes_per_worker()
    started = _started_as_one_of()
    if started is not None and started > 1 and jax.process_count() == 1:
        raise RuntimeError(
            f"This process was started as one of {started} "
            f"({NUM_PROCESSES}={started}), but JAX runs in this process "
            "alone, so it would train a model of its own on its own data. "
            "Call `keras.distribution.initialize()` at the start of the "
            "script, before any Keras object exists, to join the others."
        )


def _started_as_one_of():
    """The number of processes this one was started as one of (by the
    launcher, or as Keras reads it), or None."""
    try:
        return int(os.environ[NUM_PROCESSES])
    except (KeyError, ValueError):
        return None


def across_processes(model):
    """Whether `model`'s training runs across JAX processes with an
    `AGNOptimizer` (keras_clones's train function): where JAX runs several,
    or one started as one of `KERAS_DISTRIBUTION_NUM_PROCESSES` (the
    launcher's `--workers 1`, a resume on one); refuses what cannot train
    there."""
    several = jax.process_count() > 1
    if not several and _started_as_one_of() is None:
        return False
    distribution = keras.distribution.distribution()
    agn = agn_of(model.optimizer)
    if distribution is not None:
        if agn is None or not several:
            return False
        check_within_worker(distribution)
    if agn is None:
        if not several:
            return False
        raise ValueError(
            f"This model trains across {jax.process_count()} JAX processes "
            "with neither an `AGNOptimizer` nor a `keras.distribution`, so "
            "each process would train a model of its own. Compile it with "
            "`optimizer=keras_clones.AGNOptimizer(...)`, or set "
            "`keras.distribution.set_distribution("
            "keras.distribution.DataParallel())`."
        )
    if model.run_eagerly or not model.jit_compile:
        raise ValueError(
            "Across JAX processes an AGNOptimizer's steps run compiled, but "
            f"the model was compiled with run_eagerly={model.run_eagerly!r}, "
            f"jit_compile={model.jit_compile!r}. Compile it with "
            "`run_eagerly=False` and `jit_compile=True` (the defaults)."
        )
    return True


# The form of a `keras.distribution` within each worker, for messages.
_WITHIN_A_WORKER = (
    "keras.distribution.ModelParallel(layout_map=keras.distribution."
    "LayoutMap(keras.distribution.DeviceMesh(shape, axis_names, "
    "devices=keras_clones.worker_devices())), batch_dim_name=..., "
    "auto_shard_dataset=False)"
)


def check_within_worker(distribution):
    """Refuses a `keras.distribution` that cannot govern the step within
    each worker beside an `AGNOptimizer` across the workers: one over
    other devices than this worker's (`worker_devices`), with
    `auto_shard_dataset` (each process feeds its own rows), or over a
    worker of several processes."""
    if worker_axis.processes_per_worker() > 1:
        raise ValueError(
            "Under a `keras.distribution` an AGNOptimizer's worker is one "
            "JAX process for now, but "
            f"{worker_axis.PROCESSES_PER_WORKER}="
            f"{worker_axis.processes_per_worker()}. Start one process a "
            "worker (with all its devices), or train without the "
            "distribution (a worker of several processes is then data "
            "parallel)."
        )
    own = jax.local_devices()
    mesh = distribution.device_mesh.backend_mesh.devices.flat
    if set(mesh) != set(own):
        raise ValueError(
            "Across JAX processes an AGNOptimizer trains each worker under "
            "its own `keras.distribution`, over this worker's devices "
            f"({len(own)}: {worker_devices()}), but the distribution's "
            f"mesh has {len(list(distribution.device_mesh.devices.flat))} "
            "devices: a mesh of every worker's devices would make every "
            "local step synchronous across the workers. Build its mesh on "
            f"`keras_clones.worker_devices()`: {_WITHIN_A_WORKER}."
        )
    if distribution.auto_shard_dataset:
        raise ValueError(
            "Across JAX processes each process feeds its own rows to its "
            "worker, but the `keras.distribution` shards the dataset "
            "across processes (`auto_shard_dataset=True`, Keras's "
            f"default). Pass `auto_shard_dataset=False`: {_WITHIN_A_WORKER}."
        )


def trains_across(model):
    """Whether `model` trains across JAX processes (`across_processes`),
    where that refuses nothing (`evaluate`, `save`)."""
    try:
        optimizer = getattr(model, "optimizer", None)  # None before compile.
        return optimizer is not None and across_processes(model)
    except ValueError:
        return False


class ProcessAgreement(keras.callbacks.Callback):
    """What the processes agree on during `fit` of `model` (see the
    module's docstring); `fit` adds it last, with each process's rows (or
    None, unknown), and whether `check_same_model` saw its variables
    (`described`; else, a model built by `fit`, it checks again)."""

    def __init__(self, workers, model, rows, described=True):
        super().__init__()
        self._workers = workers
        self._trained = model
        self._rows = rows
        self._described = described

    def on_train_begin(self, logs=None):
        steps = self.params.get("steps")
        rows = self._workers.gather(-1 if self._rows is None else self._rows)
        every = self._workers.gather(-1 if steps is None else steps)
        if (every < 0).any():
            raise ValueError(
                "Across JAX processes the processes agree on the steps of "
                "an epoch when `fit` starts, but the input of process(es) "
                f"{_indices(every < 0)} has no known length. Pass "
                "`steps_per_epoch` to `fit`."
            )
        if len(set(every.tolist())) > 1:
            raise ValueError(
                "Across JAX processes every process must run the same "
                "steps per epoch (each runs the AGN period's collectives "
                f"with the others), but they would run {every.tolist()} "
                "(by process). Give each process as many rows, or pass "
                "`steps_per_epoch`."
            )
        if (rows >= 0).all() and len(set(rows.tolist())) > 1:
            raise ValueError(
                "Across JAX processes every process must take batches of "
                "the same sizes at the same steps (its steps are compiled "
                "for them), but the processes have "
                f"{rows.tolist()} rows (by process). Give each process as "
                "many rows: e.g. `x = x[: len(x) // n * n]` before taking "
                "`x[jax.process_index() :: n]`, with `n = "
                "jax.process_count()`."
            )
        model = self._trained
        if not self._described:  # Its variables, before they travel.
            check_same_model(model, self._workers)
        agn = agn_of(model.optimizer)
        step = int(keras.ops.convert_to_numpy(agn.local_step))
        if step == 0:
            self._take_the_chiefs(
                [*model.variables, *model.optimizer.variables]
            )
        elif agn.core_config.synchronised_at(step):
            # Where the local weights are the centers by design (weights
            # set since, or `PostInitCopy`): process 0's, and its centers;
            # each process's own state (inner slots) stays its own.
            centers = [
                agn.global_center_variable(v)
                for v in model.trainable_variables
                if not gradients.overwrites(v)
            ]
            self._take_the_chiefs([*model.variables, *centers])

    def _take_the_chiefs(self, variables):
        """Every process takes process 0's values of `variables`."""
        values = [v.value for v in variables]
        values = self._workers.broadcast_from_chief(values)
        for variable, value in zip(variables, values):
            variable.assign(value)

    def on_epoch_end(self, epoch, logs=None):
        # Once an epoch: an agreement after every execution costs a
        # collective (2.5 ms a step at `steps_per_execution=1`).
        model = self._trained
        model.stop_training = self._workers.any(model.stop_training)


def _indices(mask):
    return ", ".join(str(i) for i, m in enumerate(mask) if m)


def _rows(x):
    """The rows of `fit`'s `x` where it is arrays (a structure of them with
    a length), else None."""
    leaves = jax.tree.leaves(x)
    if not leaves or not all(hasattr(leaf, "shape") for leaf in leaves):
        return None
    return len(leaves[0])


def own_writer(callback, workers):
    """Whether `callback` runs on this process: a `CSVLogger` or
    `TensorBoard`, which write the (global) logs, runs on the chief
    alone."""
    writes_logs = (keras.callbacks.CSVLogger, keras.callbacks.TensorBoard)
    return workers.is_chief or not isinstance(callback, writes_logs)


def fit(keras_fit, model, *args, **kwargs):
    """Keras's `fit` (`keras_fit`): across JAX processes where it acts, and
    with an `AGNOptimizer`'s first step started before the steps
    (`first_step`); its start noted where it trains across JAX processes
    (`exits`), whatever trains."""
    check_processes_started()
    if _spans_processes(model):
        exits.fit_started()
    if model.optimizer is None:
        return keras_fit(model, *args, **kwargs)
    across = across_processes(model)
    optimizer = agn_of(model.optimizer)
    if optimizer is None:
        return keras_fit(model, *args, **kwargs)
    arguments = inspect.signature(keras_fit).bind(model, *args, **kwargs)
    arguments.apply_defaults()
    options = arguments.arguments
    callbacks = options["callbacks"]
    if isinstance(callbacks, keras.callbacks.CallbackList):
        if across:
            raise TypeError(
                "Across JAX processes `fit` takes a list of callbacks, not a "
                "`keras.callbacks.CallbackList`: it adds one of its own."
            )
        return keras_fit(model, *args, **kwargs)  # Its steps start it.
    callbacks = list(callbacks or [])
    if across:
        callbacks = _across(model, options, callbacks)
    options["callbacks"] = [*callbacks, first_step.StartBeforeSteps(optimizer)]
    with optimizer.trainer_seams.started_before_steps():
        return keras_fit(*arguments.args, **arguments.kwargs)


def _spans_processes(model):
    """Whether `fit` of `model` runs collectives across JAX processes
    (with an `AGNOptimizer`, or under a `keras.distribution` whose mesh
    has other processes' devices): every process must run it."""
    if jax.process_count() == 1:
        return False
    if trains_across(model):
        return True
    distribution = keras.distribution.distribution()
    return distribution is not None and (
        np.prod(distribution.device_mesh.shape) > jax.local_device_count()
    )


def _across(model, options, callbacks):
    """`fit`'s callbacks across processes (`options` are its arguments),
    once the processes agree on the model (`check_same_model`)."""
    own = workers(model)
    check_same_model(model, own)
    _ACROSS.add(model)
    if options["verbose"] == "auto" and not own.is_chief:
        options["verbose"] = 0
    # `batch_size` is per process (Keras's, 32 by default, for arrays).
    batch = None
    if _rows(options["x"]) is not None:
        batch = own.processes * (options["batch_size"] or 32)
    callbacks = [
        backup.for_this_process(callback, own, batch)
        for callback in callbacks
        if own_writer(callback, own)
    ]
    agreement = ProcessAgreement(
        own, model, _rows(options["x"]), described=bool(model.weights)
    )
    return [*callbacks, agreement]


def check_same_model(model, workers):
    """Raises the same `ValueError` on every process where the processes'
    models differ (`description.describe`: the architecture, the
    variables' paths, shapes and dtypes, the compilation with the
    optimizer's configuration), naming what differs and on which
    process; from gathers of a fixed size, so a disagreement reaches no
    collective shaped by the model (`description.check_same`). Every
    process must call it alike."""
    description.check_same(
        lambda values: workers.gather(np.asarray(values, np.uint32)).tolist(),
        "the model and its compilation",
        description.describe(model),
        [f"process {p}" for p in range(workers.processes)],
        workers.process,
        noun="process",
    )


def jax_state_sync(keras_sync, model):
    """Keras's `jax_state_sync`, the state of the last execution first
    unwrapped where it is global (across processes)."""
    state = internals.jax_state(model)
    if state and model in _ACROSS:
        own = workers(model)
        if own is not None:
            if any(_deleted(a) for v in state.values() for a in v):
                # The execution it was donated to failed, and `fit`'s
                # `finally` syncs it: that failure (a peer's end) is the
                # error to raise, not the deleted arrays'.
                raise sys.exc_info()[1] or RuntimeError(
                    "keras_clones: the state of the last execution was "
                    "lost with it."
                )
            internals.set_jax_state(
                model,
                # Lists of arrays (Keras tracks them: no pytrees).
                {k: [own.unwrap(a) for a in v] for k, v in state.items()},
            )
    return keras_sync(model)


def _deleted(value):
    return isinstance(value, jax.Array) and value.is_deleted()


def make_train_function(keras_make, model, force=False):
    """Keras's `make_train_function`, or keras_clones's train function
    for an `AGNOptimizer`: across processes, this module's; in one
    process, its period ends out of the steps that end none
    (`period_programs`)."""
    if model.optimizer is None:
        return keras_make(model, force)
    if model.train_function is not None and not force:
        return
    if across_processes(model):
        model.train_function = train_function.make(model, workers(model))
        return
    function = period_programs.train_function(model)
    if function is None:
        return keras_make(model, force)
    model.train_function = function


def make_test_function(keras_make, model, force=False):
    """Keras's `make_test_function`, its steps one at a time where
    `_one_step_in_flight` says."""
    keras_make(model, force)
    model.test_function = _one_step_in_flight(model, model.test_function)


def make_predict_function(keras_make, model, force=False):
    """Keras's `make_predict_function`, its steps one at a time where
    `_one_step_in_flight` says."""
    keras_make(model, force)
    model.predict_function = _one_step_in_flight(model, model.predict_function)
    return model.predict_function


def _one_step_in_flight(model, function):
    """Keras's test or predict `function`, one step at a time
    (`steps_in_flight`) across processes on a worker of several CPU
    devices. `fit`'s steps wait already (the host reads the step
    count)."""
    if steps_in_flight.on_several_cpu_devices(jax.local_devices()):
        if trains_across(model):
            return steps_in_flight.one_at_a_time(function)
    return function


def metrics_result_or_logs(keras_result, model, logs):
    """Keras's `_get_metrics_result_or_logs`; across processes, every
    metric's result from its state summed over them (`fit`'s epoch logs
    and `evaluate`'s results): every process must call it alike."""
    if not trains_across(model):
        return keras_result(model, logs)
    own = workers(model)
    # Made again for other metrics (a `compile` since).
    metrics = tuple(map(id, model.metrics_variables))
    made = _evaluation_logs.get(model)
    if made is None or made[0] != metrics:
        made = metrics, train_function.global_logs_program(model, own)
        _evaluation_logs[model] = made
    program = made[1]
    values = [v.value for v in model.metrics_variables]
    results = own.run(program, (values, model.get_metrics_result()))
    if sorted(results) != sorted(logs or {}):
        return logs
    return results


def writes_here(model):
    """Whether this process writes what `model` saves: across JAX
    processes with an `AGNOptimizer`, process 0 alone (the chief, as
    across TensorFlow workers); elsewhere, always."""
    if jax.process_index() == 0:
        return True
    return not trains_across(model)


def save(keras_save, model, *args, **kwargs):
    """Keras's `save` or `save_weights` (`keras_save`), on the chief alone
    across processes (`writes_here`)."""
    if writes_here(model):
        return keras_save(model, *args, **kwargs)
    return None


def train_on_batch(keras_train_on_batch, model, *args, **kwargs):
    """Keras's `train_on_batch`, refused across processes, with an
    `AGNOptimizer`'s first step started before the step (`first_step`)."""
    check_processes_started()
    if model.optimizer is not None and across_processes(model):
        raise NotImplementedError(
            "`train_on_batch` does not run across JAX processes with an "
            "AGNOptimizer: its steps would not be agreed. Use `fit` (with "
            "`steps_per_epoch` for a few steps)."
        )
    with first_step.started(model):
        return keras_train_on_batch(model, *args, **kwargs)


# What stands in for each of Keras's methods that keras_clones overrides on
# JAX (`keras_clones.jax_trainer.overrides`).
STAND_INS = {
    "fit": fit,
    "make_train_function": make_train_function,
    "make_test_function": make_test_function,
    "make_predict_function": make_predict_function,
    "_get_metrics_result_or_logs": metrics_result_or_logs,
    "train_on_batch": train_on_batch,
    "jax_state_sync": jax_state_sync,
    "save": save,
    "save_weights": save,
}
