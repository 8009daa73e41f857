"""`CloneModel` on Keras's JAX backend: each step one program over the
clones' devices, the batch split by rows over them."""

import jax
import keras
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from keras_clones import _keras_internals as internals
from keras_clones import optimizer_capabilities
from keras_clones.clone_model import counter_logs
from keras_clones.clone_model import functional
from keras_clones.clone_model import jax_devices
from keras_clones.clone_model import user_messages
from keras_clones.clone_model.deployment import DeploymentConfig
from keras_clones.jax_trainer import steps_in_flight
from keras_clones.replicas import worker_axis

CLONES = "clones"  # The clones' mesh axis.


@keras.saving.register_keras_serializable(package="keras_clones")
class CloneModel(keras.Model):
    """A `keras.Model` whose steps split each batch across clone devices.

    On Keras's JAX backend each step (`fit`'s, `evaluate`'s, `predict`'s)
    is one compiled program over the devices of `deployment`: every batch
    (inputs, targets and sample weights alike) is split by rows over them
    (XLA's uneven layout where they do not divide), and XLA sums the
    clones' gradients where they meet. Every clone's device holds a copy of
    the weights and of the optimizer's state. `batch_size` stays the whole
    batch.

    A step is the plain model's step on the whole batch, for any model:
    batches that do not divide by the clones (XLA's uneven layout, no
    padding), batches smaller than the number of clones, regularization
    (once), sample weights, any loss reduction, and BatchNormalization,
    whose moments are the whole batch's (on TensorFlow each clone
    normalizes by its own slice). The logs are a plain model's, plus one
    `clone_i_loss` a clone during `fit` (the loss on clone i's rows as
    `np.array_split` cuts the batch, as on TensorFlow, the model's
    regularization included, a mean over the epoch weighted by
    its rows, and `val_clone_i_loss` with validation), and an
    `AGNOptimizer`'s `communication_rounds`, as on TensorFlow.

    Across JAX processes, with an `AGNOptimizer` (under
    `keras_clones.launch`), each process is a worker of its clones'
    devices (`worker_devices()`: by default one clone, one device), not of
    all its devices as a plain model's; `clone_i_loss` is then clone i's
    loss over the workers. Workers of several processes and a
    `keras.distribution` are refused.

    Args:
        deployment: A `DeploymentConfig`, or a dict of its arguments (as
            `get_config()` gives). Defaults to one clone. On JAX it names
            this process's devices by Keras's names (`"gpu:0"`).

    Example:

    ```python
    inputs = keras.Input((64,))
    outputs = keras.layers.Dense(10, activation="softmax")(inputs)
    model = keras_clones.CloneModel(
        inputs,
        outputs,
        deployment=keras_clones.DeploymentConfig(num_clones=2),
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=64)
    ```
    """

    # Whether `metrics` has the clones' loss trackers (during `fit`).
    _fit_logs = False

    def __new__(cls, *args, **kwargs):
        return functional.new(
            CloneModel, FunctionalCloneModel, cls, args, kwargs
        )

    def __init__(self, *args, deployment=None, **kwargs):
        functional.init(CloneModel, FunctionalCloneModel, self, args, kwargs)
        self.deployment = deployment or DeploymentConfig()

    @property
    def deployment(self):
        """The `DeploymentConfig` this model's clones follow. It can be
        replaced; the next `fit`, `evaluate` or `predict` traces its steps
        again, on the new devices."""
        return self._deployment

    @deployment.setter
    def deployment(self, deployment):
        deployment = DeploymentConfig.of(deployment)
        self._deployment = deployment
        self._meshes = {}  # By whether it trains.
        clones = deployment.num_clones
        self._clone_losses = _CloneLosses(clones if clones > 1 else 0)
        self.train_function = None
        self.test_function = None
        self.predict_function = None

    def _clones_mesh(self, training):
        """The mesh of the clones' devices: for `training`, every one,
        this process's (refused otherwise); for `evaluate` and `predict`,
        those that are here, with a warning where some are not (a model
        loaded on a machine with fewer devices)."""
        mesh = self._meshes.get(training)
        if mesh is None:
            devices = (
                self._training_devices()
                if training
                else self._inference_devices()
            )
            mesh = self._meshes[training] = Mesh(np.array(devices), (CLONES,))
        return mesh

    def _training_devices(self):
        try:
            return jax_devices.clone_devices(self._deployment)
        except ValueError as error:
            raise ValueError(
                f"{error} To train this model here (e.g. after `load_model` "
                "on another machine), give it a deployment for this "
                "process's devices: `model.deployment = "
                "keras_clones.DeploymentConfig(devices=[...])`."
            ) from None

    def _inference_devices(self):
        devices, missing = jax_devices.existing_clone_devices(self._deployment)
        if missing:
            names = [jax_devices.device_name(d) for d in devices]
            user_messages.warn_missing_devices(missing, names, stacklevel=4)
        return devices

    # Steps.

    def make_train_function(self, force=False):
        return self._made(
            "train_function", super().make_train_function, force, True
        )

    def make_test_function(self, force=False):
        return self._made(
            "test_function", super().make_test_function, force, False
        )

    def make_predict_function(self, force=False):
        return self._made(
            "predict_function", super().make_predict_function, force, False
        )

    def _made(self, name, keras_make, force, training):
        """Keras's `keras_make(force)` on the clones' devices, and the
        function it sets (`name`), one step at a time on several CPU
        clones (`steps_in_flight`: XLA's CPU client could deadlock)."""
        self._on_the_clones(training)
        keras_make(force)
        function = getattr(self, name)
        devices = self._clones_mesh(training).devices.flat
        if steps_in_flight.on_several_cpu_devices(devices):
            function = steps_in_flight.one_at_a_time(function)
        setattr(self, name, function)
        return function

    def _on_the_clones(self, training):
        """Puts a copy of every variable on each clone's device (refusing
        what a `CloneModel` cannot run under)."""
        self._check_runs_here()
        copies = NamedSharding(self._clones_mesh(training), PartitionSpec())
        variables = [*self.variables, *self.metrics_variables]
        optimizer = getattr(self, "optimizer", None)  # None before compile.
        if optimizer is not None:
            variables += optimizer.variables
        for variable in variables:
            if variable.value.sharding != copies:
                variable.assign(jax.device_put(variable.value, copies))

    def worker_devices(self):
        """This process's devices of its worker across JAX processes, by
        Keras's names (as `keras_clones.worker_devices()` names a plain
        model's, all of the process's devices): its clones'. Every
        process's worker is its devices at the same places."""
        devices = self._clones_mesh(True).devices.flat
        return [jax_devices.device_name(d) for d in devices]

    def _check_runs_here(self):
        """Refuses workers of several processes and a
        `keras.distribution`."""
        per_worker = worker_axis.processes_per_worker()
        if per_worker > 1:
            raise ValueError(
                "A `CloneModel` across JAX processes is a worker of its own "
                "clones, in one process, but this run makes workers of "
                f"{per_worker} processes ({worker_axis.PROCESSES_PER_WORKER}"
                f"={per_worker}). Launch one process a worker, or train a "
                "plain `keras.Model` there: each worker is all its "
                "processes' devices (docs/jax_processes.md)."
            )
        if keras.distribution.distribution() is not None:
            raise ValueError(
                "A `CloneModel` splits its batches over its own devices, so "
                "it cannot run under a `keras.distribution` (set: "
                f"{keras.distribution.distribution()!r}), which would split "
                "them again. Unset the distribution, or train a plain "
                "`keras.Model` under it."
            )

    def _split(self, data, training):
        """`data` laid out by rows over the clones, within a step; run
        eagerly (`run_eagerly=True`), rows that do not divide by the
        clones go whole to each (XLA's uneven layout is a compiled
        program's), with the same results."""
        mesh = self._clones_mesh(training)
        rows = NamedSharding(mesh, PartitionSpec(CLONES))

        def split(value):
            if value is None or not np.ndim(value):
                return value
            if worker_axis.workers() is not None:
                return value  # A worker's step: `Workers.shard_rows`.
            if isinstance(value, jax.core.Tracer):
                return jax.lax.with_sharding_constraint(value, rows)
            if len(value) % mesh.size:
                return jax.device_put(value, rows.update(spec=PartitionSpec()))
            return jax.device_put(value, rows)

        return jax.tree.map(split, data)

    def train_step(self, state, data):
        logs, state = super().train_step(
            state, self._split(data, training=True)
        )
        rounds = self._communication_rounds_position()
        if rounds is not None:  # An `AGNOptimizer`'s, as on TensorFlow.
            logs = {**logs, "communication_rounds": state[2][rounds]}
        return logs, state

    def _communication_rounds_position(self):
        """Where the optimizer's `communication_rounds` (an
        `AGNOptimizer`'s) is among its variables, or None."""
        optimizer = optimizer_capabilities.unwrapped(self.optimizer)
        rounds = getattr(optimizer, "communication_rounds", None)
        for position, variable in enumerate(self.optimizer.variables):
            if variable is rounds:
                return position
        return None

    def test_step(self, state, data):
        return super().test_step(state, self._split(data, training=False))

    def predict_step(self, state, data):
        return super().predict_step(state, self._split(data, training=False))

    # The clones' losses in `fit`'s logs.

    def _logged_clone_losses(self):
        """The clones' loss trackers, where `fit` logs them (several
        clones, a compiled loss)."""
        if not self._fit_logs or internals.compiled_loss(self) is None:
            return []
        return self._clone_losses.trackers

    @property
    def metrics(self):
        return super().metrics + self._logged_clone_losses()

    def _update_metrics_variables(
        self, metrics_variables, unscaled_loss, x, y, y_pred, sample_weight
    ):
        logs, metrics_variables = super()._update_metrics_variables(
            metrics_variables, unscaled_loss, x, y, y_pred, sample_weight
        )
        trackers = self._logged_clone_losses()
        if not trackers:
            return logs, metrics_variables
        mapping = list(zip(self.metrics_variables, metrics_variables))
        # The compiled loss updates its per-output losses' metrics: here
        # in a scope of its own, left.
        with keras.StatelessScope(state_mapping=mapping):
            losses = _clone_losses(
                self, len(trackers), unscaled_loss, y, y_pred, sample_weight
            )
        with keras.StatelessScope(state_mapping=mapping) as scope:
            for tracker, (loss, rows) in zip(trackers, losses):
                if rows:
                    tracker.update_state(loss, sample_weight=rows)
            logs.update({t.name: t.result() for t in trackers})
        updated = [scope.get_current_value(v) for v, _ in mapping]
        return logs, [
            value if new is None else new
            for new, (_, value) in zip(updated, mapping)
        ]

    def fit(self, *args, **kwargs):
        self._check_runs_here()
        fit = super().fit
        args, kwargs = counter_logs.with_integer_counters(fit, args, kwargs)
        self._fit_logs = True
        try:
            return fit(*args, **kwargs)
        finally:
            self._fit_logs = False

    def evaluate(self, *args, **kwargs):
        self._check_runs_here()
        # `fit` validates with its own `CallbackList`: its logs get
        # `val_clone_i_loss` too. Otherwise the result is a plain model's.
        validation = internals.called_by_fit(kwargs.get("callbacks"))
        fit_logs, self._fit_logs = self._fit_logs, validation
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            self._fit_logs = fit_logs

    def predict(self, *args, **kwargs):
        self._check_runs_here()
        return super().predict(*args, **kwargs)

    def save(self, filepath, *args, **kwargs):
        user_messages.refuse_legacy_h5(filepath)
        return super().save(filepath, *args, **kwargs)

    def get_config(self):
        config = super().get_config()
        config["deployment"] = self._deployment.get_config()
        return config


@keras.saving.register_keras_serializable(
    package="keras_clones", name="CloneModel"
)
class FunctionalCloneModel(CloneModel, internals.Functional):
    """A `CloneModel` built from inputs and outputs, as `keras.Model`
    does."""


class _CloneLosses:
    """Each clone's loss on its slice, `clone_i_loss`: means weighted by
    the clone's rows, as Keras's loss tracker. Held outside Keras's
    tracking, so that `model.metrics` (and `evaluate`) are a plain
    model's; `CloneModel.metrics` adds them during `fit`."""

    def __init__(self, count):
        self.trackers = [
            keras.metrics.Mean(name=f"clone_{i}_loss") for i in range(count)
        ]


def _clone_losses(model, clones, unscaled_loss, y, y_pred, sample_weight):
    """`(loss, rows)` of each of `clones` clones: its slice's compiled
    loss, plus the model's other terms (regularization, `add_loss`) as the
    whole batch's loss has them."""
    compiled = internals.compiled_loss(model)
    size = jax.tree.leaves(y_pred)[0].shape[0]
    whole = compiled(y, y_pred, sample_weight)
    others = unscaled_loss - whole
    if size % clones == 0 and not isinstance(y_pred, (list, tuple, dict)):
        # A block of rows a clone, each where its clone's device holds it:
        # no rows move between the devices (slices would).
        def blocks(value):
            return value.reshape(clones, size // clones, *value.shape[1:])

        stacked = [jax.tree.map(blocks, v) for v in (y, y_pred, sample_weight)]
        losses = jax.vmap(compiled)(*stacked) + others
        return [(losses[i], size // clones) for i in range(clones)]
    parts = np.array_split(np.arange(size), clones)
    bounds = np.cumsum([0] + [len(part) for part in parts])
    losses = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        if start == end:
            losses.append((None, 0))
            continue

        def part(value, start=start, end=end):
            return None if value is None else value[start:end]

        sliced = [jax.tree.map(part, v) for v in (y, y_pred, sample_weight)]
        losses.append((compiled(*sliced) + others, int(end - start)))
    return losses
