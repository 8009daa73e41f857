"""`fit` on a `ParameterServerStrategy`, run by the coordinator.

Keras's own loop, over asynchronous steps (`training.AsyncTraining`): a
step is one worker batch, applied by the coordinator; an epoch is
`steps_per_epoch` steps and ends when all of them are applied. Callbacks,
the progress bar and `History` see every step as the coordinator applies
it (every K-th with `steps_per_execution=K`, whose K steps a scheduled
function computes and the coordinator applies in one call);
`BackupAndRestore` and `ModelCheckpoint` save from the coordinator.
"""

import inspect

import keras
import tensorflow as tf

from keras_clones import _keras_internals as internals
from keras_clones import optimizer_capabilities
from keras_clones.parameter_server import cluster
from keras_clones.parameter_server.agn_periods import AGNPeriods
from keras_clones.parameter_server.downpour import GradientSteps
from keras_clones.parameter_server.training import AsyncTraining
from keras_clones.parameter_server.training import check_in_flight_per_worker
from keras_clones.parameter_server.training import check_positive_integer

# `fit`'s arguments that parameter-server training does not take, with their
# defaults and what to do instead.
_REFUSED = {
    "y": (None, "put the targets in the dataset's elements, `(x, y)`"),
    "sample_weight": (
        None,
        "put the weights in the dataset's elements, `(x, y, sample_weight)`",
    ),
    "batch_size": (None, "batch the dataset"),
    "class_weight": (None, "weight the samples in the dataset"),
    "validation_split": (
        0.0,
        "pass the held-out data as `validation_data` (a dataset, or arrays "
        "the coordinator evaluates on)",
    ),
}


_LOST_PS_MESSAGE = (
    "Parameter-server training stopped: a parameter server died or stopped "
    "answering, and the model's variables lived there. Restart the cluster "
    "and `fit` again; with `keras.callbacks.BackupAndRestore`, training "
    "resumes from the last backup (the workers' inner-optimizer state "
    "starts again from zero).\n\nTensorFlow reported: "
)


def fit(model, fit_method, args, kwargs, in_flight_per_worker=1):
    """Runs `model.fit(*args, **kwargs)` (with `fit_method`'s signature)
    as asynchronous training on the model's `ParameterServerStrategy`,
    with up to `in_flight_per_worker` scheduled functions per worker."""
    bound = inspect.signature(fit_method).bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = bound.arguments
    internals.assert_compiled(model, "fit")
    check_arguments(model, arguments)
    check_in_flight_per_worker(in_flight_per_worker)
    dataset = _repeated(arguments["x"])
    _build(model, dataset)
    training = AsyncTraining(model, dataset, _work(model), in_flight_per_worker)
    epochs = arguments["epochs"]
    steps = arguments["steps_per_epoch"]
    callbacks = arguments["callbacks"]
    if not isinstance(callbacks, keras.callbacks.CallbackList):
        verbose = arguments["verbose"]
        callbacks = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=verbose != 0,
            verbose=verbose,
            epochs=epochs,
            steps=steps,
            model=model,
        )
    model.stop_training = False
    callbacks.on_train_begin()
    epoch_logs = None
    initial_epoch = internals.initial_epoch(model) or arguments["initial_epoch"]
    try:
        for epoch in range(initial_epoch, epochs):
            model.reset_metrics()
            training.reset_metrics()
            callbacks.on_epoch_begin(epoch)
            logs = training.run_epoch(steps, callbacks)
            epoch_logs = {name: float(value) for name, value in logs.items()}
            if _validates(model, epoch, arguments):
                epoch_logs.update(_validation_logs(model, arguments, callbacks))
            callbacks.on_epoch_end(epoch, epoch_logs)
            if model.stop_training:
                break
    except tf.errors.UnavailableError as e:
        # `ClusterCoordinator` runs a lost worker's work elsewhere; what
        # reaches here is a lost parameter server.
        raise type(e)(e.node_def, e.op, _LOST_PS_MESSAGE + e.message) from None
    if isinstance(model.optimizer, keras.optimizers.Optimizer) and epochs > 0:
        model.optimizer.finalize_variable_values(model.trainable_weights)
    callbacks.on_train_end(logs=epoch_logs)
    return model.history


def _validates(model, epoch, arguments):
    return arguments["validation_data"] is not None and (
        internals.should_evaluate(model, epoch, arguments["validation_freq"])
    )


def _validation_logs(model, arguments, callbacks):
    """Keras's validation at the end of an epoch: `evaluate` on the
    coordinator, its logs named `val_...`."""
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(
        arguments["validation_data"]
    )
    logs = model.evaluate(
        x=x,
        y=y,
        sample_weight=sample_weight,
        batch_size=arguments["validation_batch_size"],
        steps=arguments["validation_steps"],
        callbacks=callbacks,
        return_dict=True,
    )
    return {f"val_{name}": value for name, value in logs.items()}


def check_arguments(model, arguments):
    """Raises a clear error for what parameter-server training cannot do."""
    x = arguments["x"]
    if not (isinstance(x, tf.data.Dataset) or callable(x)):
        raise TypeError(
            "Under ParameterServerStrategy, `fit` takes a `tf.data.Dataset` "
            "or a function returning one, which every worker iterates (each "
            f"its own copy). Received: x of type {type(x).__name__}. Wrap "
            "arrays with `tf.data.Dataset.from_tensor_slices((x, y))"
            ".batch(...)`."
        )
    for name, (default, instead) in _REFUSED.items():
        if not _is_default(arguments[name], default):
            raise ValueError(
                f"Under ParameterServerStrategy, `fit` does not take "
                f"`{name}`: {instead}. Received: {name} of type "
                f"{type(arguments[name]).__name__}."
            )
    if arguments["validation_data"] is not None:
        # Keras's own error for a bad `validation_freq`, before training.
        internals.should_evaluate(model, 0, arguments["validation_freq"])
    steps = arguments["steps_per_epoch"]
    if steps is None:
        raise ValueError(
            "Under ParameterServerStrategy, `fit` needs `steps_per_epoch`: "
            "the workers repeat their datasets, so an epoch is a number of "
            "steps (worker batches). Pass `steps_per_epoch=...`."
        )
    per_call = check_positive_integer(
        "steps_per_execution",
        model.steps_per_execution,
        "steps per scheduled function under ParameterServerStrategy",
        " Compile with e.g. `steps_per_execution=10`, or leave it at 1.",
    )
    agn = optimizer_capabilities.takes_local_steps(
        optimizer_capabilities.unwrapped(model.optimizer)
    )
    if agn:
        check_agn(model.optimizer, steps, per_call)
    elif per_call > 1:
        check_optimizer_on_tensors(model.optimizer, per_call)
    if steps % per_call:
        raise ValueError(
            "Under ParameterServerStrategy, a scheduled function computes "
            "`steps_per_execution` steps, so `steps_per_epoch` must be a "
            f"multiple of it. Received: steps_per_epoch={steps}, "
            f"steps_per_execution={per_call}."
        )
    check_deployment(model.deployment, model.distribute_strategy)


def check_optimizer_on_tensors(optimizer, per_call):
    """Refuses a plain optimizer that a worker cannot run on its tensors,
    as it does between the `per_call` steps of a scheduled function."""
    if optimizer_capabilities.loss_scaled(optimizer):
        raise ValueError(
            "Under ParameterServerStrategy with `steps_per_execution` > 1, "
            "a worker runs the optimizer on its own copy of the weights, "
            "which a LossScaleOptimizer (`mixed_float16`) cannot do: its "
            "loss scale moves on the parameter servers. Received: "
            f"steps_per_execution={per_call} with {optimizer!r}. Compile "
            "with `steps_per_execution=1`, or train in float32 or "
            "`mixed_bfloat16`."
        )
    for option, default in (
        ("gradient_accumulation_steps", None),
        ("use_ema", False),
    ):
        value = getattr(optimizer, option, default)
        if value != default:
            raise ValueError(
                "Under ParameterServerStrategy with `steps_per_execution` "
                "> 1, a worker runs the optimizer on its own copy of the "
                f"weights, which `{option}` cannot do (it writes the "
                f"optimizer's variables directly). Received: {option}="
                f"{value!r}, steps_per_execution={per_call}. Compile with "
                f"`steps_per_execution=1`, or create the optimizer without "
                f"`{option}`."
            )


def check_agn(optimizer, steps, per_call=1):
    """Refuses an `AGNOptimizer` parameter servers cannot train with, at
    `steps` steps per epoch and `per_call` per scheduled function."""
    if optimizer_capabilities.loss_scaled(optimizer):
        raise ValueError(
            "Under ParameterServerStrategy, an AGNOptimizer cannot be "
            "wrapped in a LossScaleOptimizer yet. Train in float32, or with "
            "a plain optimizer."
        )
    if optimizer.overlap or optimizer.fragments > 1:
        raise ValueError(
            "`overlap=True` and `fragments` > 1 do not apply to "
            "parameter-server training: there each worker's period "
            "already runs apart from the others', and the coordinator "
            "applies its whole commit when it arrives. Create the "
            "AGNOptimizer with `overlap=False` and `fragments=1`."
        )
    period = optimizer.communication_period
    if per_call != 1 and per_call % period:
        raise ValueError(
            "Under ParameterServerStrategy, a scheduled function trains "
            "whole communication periods of an AGNOptimizer, so "
            "`steps_per_execution` must be 1 (one period per function) or "
            "a multiple of `communication_period`. Received: "
            f"steps_per_execution={per_call}, communication_period={period}."
        )
    if steps % period:
        raise ValueError(
            "Under ParameterServerStrategy, each worker trains whole "
            "communication periods, so `steps_per_epoch` must be a multiple "
            f"of `communication_period`. Received: steps_per_epoch={steps}, "
            f"communication_period={period}."
        )


def _work(model):
    if optimizer_capabilities.takes_local_steps(model.optimizer):
        return AGNPeriods(model, model.optimizer, model.steps_per_execution)
    return GradientSteps(model, model.steps_per_execution)


def check_deployment(deployment, strategy):
    """Raises `ValueError` if `deployment` contradicts `strategy`'s
    cluster. Its defaults take the cluster as it is."""
    workers, ps = cluster.num_workers(strategy), cluster.num_ps(strategy)
    problems = []
    if deployment.num_ps_tasks not in (0, ps):
        problems.append(
            f"num_ps_tasks={deployment.num_ps_tasks} (the cluster has "
            f"{ps} parameter servers)"
        )
    if deployment.num_replicas not in (1, workers):
        problems.append(
            f"num_replicas={deployment.num_replicas} (the cluster has "
            f"{workers} workers)"
        )
    jobs = (deployment.worker_device, deployment.ps_device)
    if deployment.num_ps_tasks and jobs != ("/job:worker", "/job:ps"):
        config = deployment.get_config()
        problems.append(
            f"worker_job_name={config['worker_job_name']!r}, "
            f"ps_job_name={config['ps_job_name']!r} (the strategy's jobs "
            "are 'worker' and 'ps')"
        )
    if problems:
        raise ValueError(
            "The model's DeploymentConfig contradicts the "
            "ParameterServerStrategy's cluster: "
            f"{'; '.join(problems)}. Leave `num_ps_tasks`, `num_replicas` "
            "and the job names at their defaults: the strategy's cluster "
            "decides them."
        )
    if deployment.replica_id != 0:
        raise ValueError(
            "Under ParameterServerStrategy, the coordinator schedules each "
            "step on whichever worker is free, so `replica_id` means "
            "nothing and must be 0. Received: "
            f"replica_id={deployment.replica_id}."
        )
    devices = cluster.worker_devices()
    for i in range(deployment.num_clones):
        device = tf.DeviceSpec.from_string(deployment.clone_device(i))
        local = device.replace(job=None).to_string()
        if local and local not in devices:
            raise ValueError(
                f"Clone {i} is placed on {local!r}, which the workers do not "
                f"have. Their devices: {', '.join(sorted(devices))}. Give "
                "the model a deployment for the workers' devices: "
                "`model.deployment = keras_clones.DeploymentConfig("
                "devices=[...])`."
            )
    if deployment.variable_update == "replicated":
        raise ValueError(
            "Under ParameterServerStrategy the variables live on the "
            "parameter servers, so `variable_update='replicated'` cannot "
            "apply. Use `variable_update='parameter_server'` (the default)."
        )


def _is_default(value, default):
    return value is default or (default == 0.0 and value == 0.0)


def _repeated(x):
    """The dataset (or function returning it) every worker iterates,
    repeated."""
    if isinstance(x, tf.data.Dataset):
        return x.repeat()
    return lambda: x().repeat()


def _build(model, dataset):
    """Builds `model` and its optimizer on the parameter servers, from the
    shapes of one batch, before any worker reads them."""
    if model.built and model.optimizer.built:
        return
    if callable(dataset):
        dataset = dataset()
    batch = next(iter(dataset.take(1)))
    with model.distribute_strategy.scope():
        internals.symbolic_build(model, data_batch=batch)
