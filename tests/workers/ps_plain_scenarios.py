"""Parameter-server scenarios of plain training: one and two workers against
one process and the updates applied, a resume, sparse gradients, refusals, a
result overwritten late, two parameter servers and where ops run."""

import os

import keras
import numpy as np
import tensorflow as tf
from helpers import InterruptAtEpoch
from ps_common import BATCH
from ps_common import EPOCHS
from ps_common import STEPS
from ps_common import AppliedAfterTheNextRead
from ps_common import compare
from ps_common import data
from ps_common import dataset
from ps_common import functional
from ps_common import max_difference
from ps_common import subclassed
from ps_common import two_clones
from ps_common import weight_change_agn

import keras_clones
from keras_clones.parameter_server import cluster as cluster_of
from keras_clones.parameter_server import training as training_module


def one_worker(strategy):
    results = {
        "functional_sgd": compare(
            strategy,
            lambda: functional(keras_clones.CloneModel),
            lambda: functional(keras.Model),
            lambda: keras.optimizers.SGD(0.05, momentum=0.9),
        ),
        "subclassed_adam": compare(
            strategy,
            subclassed(keras_clones.CloneModel),
            subclassed(keras.Model),
            lambda: keras.optimizers.Adam(0.01),
        ),
        "two_clones_adam": compare(
            strategy,
            lambda: functional(
                keras_clones.CloneModel, deployment=two_clones()
            ),
            lambda: functional(keras.Model),
            lambda: keras.optimizers.Adam(0.01),
        ),
    }
    return results


class SumOfAppliedGradients:
    """A step-hooks observer: the sum of the gradients the coordinator
    applies, in variables of its own."""

    def __init__(self, variables):
        self.sums = [tf.Variable(tf.zeros(v.shape)) for v in variables]
        self.count = tf.Variable(0)

    def observe(self, step):
        for total, grad in zip(self.sums, step.grads):
            total.assign_add(grad)
        self.count.assign_add(1)


class AppliedStepByStep(keras.callbacks.Callback):
    """After each applied step: how many results the coordinator applied,
    and how far the weights are from where the gradients it applied put
    them (`start - learning_rate * sums`)."""

    def __init__(self, applied, start, learning_rate):
        super().__init__()
        self.applied, self.start = applied, start
        self.learning_rate = learning_rate
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        expected = [
            w - self.learning_rate * s.numpy()
            for w, s in zip(self.start, self.applied.sums)
        ]
        weights = [v.numpy() for v in self.model.trainable_variables]
        self.steps.append(
            [int(self.applied.count.numpy()), max_difference(weights, expected)]
        )


def two_workers(strategy):
    """2 workers: plain SGD and Hermans's AGN, each with an outer SGD
    without momentum, against the sum of what the coordinator applied
    (with 4 slots, SGD also after each step, as the slots wrap around)."""
    optimizers = {
        "sgd": (lambda: keras.optimizers.SGD(0.05), 0.05),
        "sgd_in_flight_2": (lambda: keras.optimizers.SGD(0.05), 0.05),
        "agn": (
            lambda: keras_clones.AGNOptimizer(
                keras.optimizers.Adam(0.01),
                communication_period=3,
                outer_optimizer=keras.optimizers.SGD(1.0),
                commit="weight_change",
            ),
            1.0,
        ),
    }
    results = {}
    for name, (optimizer, outer_lr) in optimizers.items():
        with strategy.scope():
            model = functional(keras_clones.CloneModel)
            model.compile(optimizer(), "mse")
        start = [v.numpy() for v in model.trainable_variables]
        applied = SumOfAppliedGradients(model.trainable_variables)
        model.step_hooks.add(applied)
        step_by_step = AppliedStepByStep(applied, start, outer_lr)
        # AGN's epoch is 2 results, one a worker: without a wait before
        # each is applied, a worker that takes up its period late reads
        # after the other's commit landed, and no result is stale.
        callbacks = {
            "sgd_in_flight_2": [step_by_step],
            "agn": [AppliedAfterTheNextRead()],
        }
        history = model.fit(
            dataset(),
            epochs=EPOCHS,
            steps_per_epoch=STEPS,
            callbacks=callbacks.get(name, []),
            verbose=0,
            in_flight_per_worker=2 if name.endswith("in_flight_2") else 1,
        )
        expected = [
            w - outer_lr * s.numpy() for w, s in zip(start, applied.sums)
        ]
        results[name] = {
            "weights": max_difference(
                [v.numpy() for v in model.trainable_variables], expected
            ),
            "moved": max_difference(start, expected),
            "applied": int(applied.count.numpy()),
            "iterations": int(model.optimizer.iterations.numpy()),
            "staleness": history.history["staleness"],
            "max_staleness": history.history["max_staleness"],
            "rounds": history.history.get("communication_rounds"),
            "step_by_step": step_by_step.steps,
        }
    return results


def resume(strategy):
    """3 epochs uninterrupted, against 2 epochs, an interruption, and a new
    model resumed by `BackupAndRestore`: with Adam (its state on the
    parameter server) and with AGN (the centers and the outer optimizer;
    inner SGD, whose workers keep no state to lose)."""
    optimizers = {
        "adam": lambda: keras.optimizers.Adam(0.01),
        "agn": lambda: keras_clones.AGNOptimizer(
            keras.optimizers.SGD(0.05),
            communication_period=3,
            outer_optimizer=keras.optimizers.SGD(0.9, momentum=0.5),
            commit="weight_change",
        ),
    }
    results = {}
    for name, optimizer in optimizers.items():

        def train(callbacks, optimizer=optimizer):
            with strategy.scope():
                model = functional(keras_clones.CloneModel)
                model.compile(optimizer(), "mse")
            history = model.fit(
                dataset(),
                epochs=3,
                steps_per_epoch=STEPS,
                callbacks=callbacks,
                verbose=0,
            )
            return model, history

        uninterrupted, _ = train([])
        backup = keras.callbacks.BackupAndRestore(
            os.path.join(os.environ["OUT"], f"backup_{name}")
        )
        try:
            train([backup, InterruptAtEpoch(2)])
        except RuntimeError:
            pass
        resumed, history = train([backup])
        results[name] = {
            "weights": max_difference(
                resumed.get_weights(), uninterrupted.get_weights()
            ),
            "optimizer": max_difference(
                [v.numpy() for v in resumed.optimizer.variables],
                [v.numpy() for v in uninterrupted.optimizer.variables],
            ),
            "epochs_run": len(history.history["loss"]),
            "iterations": int(resumed.optimizer.iterations.numpy()),
        }
    return results


def sparse(strategy):
    """An Embedding's sparse gradients, async (SGD, Adam, and AGN with
    inner Adam; Adam at 3 steps per function, AGN at 2 periods) against one
    process at the same `steps_per_execution`."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 20, size=(BATCH * STEPS, 3))
    y = rng.normal(size=(BATCH * STEPS, 1)).astype("float32")

    def embedding_model(cls):
        keras.utils.set_random_seed(1)
        inputs = keras.Input((3,), dtype="int32")
        hidden = keras.layers.Flatten()(keras.layers.Embedding(20, 4)(inputs))
        return cls(inputs, keras.layers.Dense(1)(hidden))

    def agn():
        return keras_clones.AGNOptimizer(
            keras.optimizers.Adam(0.01), communication_period=3
        )

    adam = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
    optimizers = {  # name: (optimizer, reference class, steps per call)
        "sgd": (lambda: keras.optimizers.SGD(0.1), keras.Model, 1),
        "adam": (adam, keras.Model, 1),
        "agn": (agn, keras_clones.CloneModel, 1),
        "adam_steps_per_execution": (adam, keras.Model, 3),
        "agn_steps_per_execution": (agn, keras_clones.CloneModel, 6),
    }
    results = {}
    for name, (optimizer, reference, per_call) in optimizers.items():
        with strategy.scope():
            model = embedding_model(keras_clones.CloneModel)
            model.compile(optimizer(), "mse", steps_per_execution=per_call)
        model.fit(
            tf.data.Dataset.from_tensor_slices((ids, y)).batch(BATCH),
            epochs=EPOCHS,
            steps_per_epoch=STEPS,
            verbose=0,
        )
        plain = embedding_model(reference)
        plain.compile(optimizer(), "mse", steps_per_execution=per_call)
        plain.fit(
            ids, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0
        )
        results[name] = max_difference(model.get_weights(), plain.get_weights())
    return results


def refusal(fit):
    try:
        fit()
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def refusals(strategy):
    """What `fit` refuses under ParameterServerStrategy, with messages."""
    with strategy.scope():
        model = functional(keras_clones.CloneModel)
        model.compile("sgd", "mse")

    def fit(x=None, **kwargs):
        kwargs.setdefault("steps_per_epoch", 2)
        return lambda: model.fit(dataset() if x is None else x, **kwargs)

    def with_deployment(**kwargs):
        def fit_with():
            model.deployment = keras_clones.DeploymentConfig(**kwargs)
            model.fit(dataset(), steps_per_epoch=2)

        return fit_with

    results = {
        "arrays": refusal(fit(data()[0], y=data()[1])),
        "y": refusal(fit(y=data()[1])),
        "no_steps": refusal(fit(steps_per_epoch=None)),
        "validation_split": refusal(fit(validation_split=0.5)),
        "validation_freq": refusal(
            fit(validation_data=dataset(), validation_freq="often")
        ),
        "num_ps_tasks": refusal(with_deployment(num_ps_tasks=3)),
        "num_replicas": refusal(
            with_deployment(num_replicas=5, num_ps_tasks=1)
        ),
        "replica_id": refusal(
            with_deployment(replica_id=1, num_replicas=2, num_ps_tasks=1)
        ),
        "missing_device": refusal(with_deployment(devices=["/device:CPU:5"])),
        "replicated": refusal(
            with_deployment(
                devices=["/device:CPU:0", "/device:CPU:1"],
                variable_update="replicated",
            )
        ),
        "job_names": refusal(
            with_deployment(num_ps_tasks=1, ps_job_name="params")
        ),
        "matching_deployment": refusal(
            with_deployment(num_ps_tasks=1, num_replicas=2)
        ),
        "in_flight_zero": refusal(fit(in_flight_per_worker=0)),
        "in_flight_float": refusal(fit(in_flight_per_worker=1.5)),
    }
    model.deployment = keras_clones.DeploymentConfig()
    with strategy.scope():
        model.compile("sgd", "mse", steps_per_execution=4)
    results["steps_per_execution"] = refusal(fit())

    def plain_at(per_call, optimizer="sgd"):
        def fit_with():
            with strategy.scope():
                model.compile(optimizer, "mse", steps_per_execution=per_call)
            model.fit(dataset(), steps_per_epoch=4)

        return fit_with

    optimizers = keras.optimizers
    results.update(
        steps_per_execution_zero=refusal(plain_at(0)),
        steps_per_execution_float=refusal(plain_at(2.0)),
        loss_scaled_steps_per_execution=refusal(
            plain_at(2, optimizers.LossScaleOptimizer(optimizers.SGD()))
        ),
        ema_steps_per_execution=refusal(
            plain_at(2, optimizers.SGD(use_ema=True))
        ),
        accumulation_steps_per_execution=refusal(
            plain_at(2, optimizers.SGD(gradient_accumulation_steps=2))
        ),
    )

    def agn(inner=None, **kwargs):
        def fit_with():
            with strategy.scope():
                optimizer = keras_clones.AGNOptimizer(
                    (inner or keras.optimizers.SGD)(), communication_period=3
                )
                if kwargs.pop("loss_scaled", False):
                    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
                per_call = kwargs.pop("steps_per_execution", 1)
                model.compile(optimizer, "mse", steps_per_execution=per_call)
            model.fit(dataset(), **{"steps_per_epoch": 6, **kwargs})

        return fit_with

    results.update(
        agn_steps=refusal(agn(steps_per_epoch=4)),
        agn_steps_per_execution=refusal(agn(steps_per_execution=4)),
        agn_lion_fine=refusal(agn(optimizers.Lion)),
        agn_loss_scaled=refusal(agn(loss_scaled=True)),
        agn_fine=refusal(agn(optimizers.AdamW)),
    )
    return results


def overwritten(strategy):
    """A late write, as from a run that `ClusterCoordinator` gave up on:
    step 2's result written again to the slot of step 3 after step 3
    wrote it (1 worker, 1 in flight: one slot). What `fit` raised, and the
    updates applied."""
    from keras_clones.parameter_server import training

    apply = training.AsyncTraining._apply
    saved = {}

    def late_write(self, number):
        if int(number) == 3:
            self._results.assign(saved["step 2"])
        logs = apply(self, number)
        saved[f"step {int(number)}"] = self._results.read_value()
        return logs

    with strategy.scope():
        model = functional(keras_clones.CloneModel)
        model.compile(keras.optimizers.SGD(0.05), "mse")
    training.AsyncTraining._apply = late_write
    try:
        model.fit(dataset(), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0)
        raised = "no error"
    except RuntimeError as e:
        raised = str(e)
    finally:
        training.AsyncTraining._apply = apply
    return {
        "raised": raised,
        "iterations": int(model.optimizer.iterations.numpy()),
    }


def two_parameter_servers(strategy):
    """SGD with momentum, Adam and AGN (`weight_change_agn`: plain SGD with
    one worker) on 1 worker, the variables spread over 2 parameter
    servers, against one process: the largest weight differences."""
    x, y = data()
    optimizers = {
        "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
        "adam": lambda: keras.optimizers.Adam(0.01),
        "agn": weight_change_agn,
    }
    results = {}
    for name, optimizer in optimizers.items():
        with strategy.scope():
            model = functional(keras_clones.CloneModel)
            model.compile(optimizer(), "mse")
        results["servers"] = len(
            {v.value.device for v in model.trainable_variables}
        )
        model.fit(dataset(), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0)
        plain = functional(keras.Model)
        plain.compile(
            keras.optimizers.SGD(0.05) if name == "agn" else optimizer(), "mse"
        )
        plain.fit(
            x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0
        )
        results[name] = max_difference(model.get_weights(), plain.get_weights())
    return results


def traced_devices(function):
    """The (job, task) of every op of each graph `function` (a
    `tf.function`) traced, as strings ("" where unset)."""
    placed = set()
    for concrete in function._list_all_concrete_functions():
        for op in concrete.graph.get_operations():
            device = tf.DeviceSpec.from_string(op.device or "")
            task = "" if device.task is None else str(device.task)
            placed.add((device.job or "", task))
    return sorted(placed)


def placement(strategy):
    """Plain Adam and AGN, with `num_ps_tasks` the cluster's servers: the
    devices the coordinator's apply and the worker's compute were traced
    on."""
    servers = cluster_of.num_ps(strategy)
    made = []
    init = training_module.AsyncTraining.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    training_module.AsyncTraining.__init__ = recording
    optimizers = {
        "adam": lambda: keras.optimizers.Adam(0.01),
        "agn": weight_change_agn,
    }
    results = {}
    try:
        for name, optimizer in optimizers.items():
            deployment = keras_clones.DeploymentConfig(num_ps_tasks=servers)
            with strategy.scope():
                model = functional(keras_clones.CloneModel)
                model.deployment = deployment
                model.compile(optimizer(), "mse")
            model.fit(dataset(), epochs=1, steps_per_epoch=3, verbose=0)
            results[name] = {
                "coordinator": traced_devices(made[-1]._on_coordinator),
                "worker": traced_devices(made[-1]._on_worker),
            }
    finally:
        training_module.AsyncTraining.__init__ = init
    return results
