"""Replicated variables: a copy of the model's weights on every clone device.

tf_cnn_benchmarks' `VariableMgrLocalReplicated` for a `CloneModel`: clone 0
uses the model's own variables; every other clone gets its own copy of each
trainable variable, on its device, with its own optimizer. The clones'
gradients are all-reduced with TensorFlow's cross-device ops, and every copy
applies the same update, so the copies stay bit-identical. Only the model's
own variables are tracked, so saving stores one copy.
"""

import keras
import tensorflow as tf

from keras_clones import optimizer_capabilities


class _CopyScope(keras.StatelessScope):
    """Runs a clone on its copies, recording what the clone assigns."""

    def __init__(self, state_mapping):
        super().__init__(
            state_mapping, collect_losses=True, initialize_variables=False
        )
        self.assigned = {}

    def add_update(self, update):
        super().add_update(update)
        self.assigned[id(update[0])] = update[0]

    def value_of(self, variable):
        value = self.get_current_value(variable)
        return variable.value if value is None else value

    def write_assignments(self, exclude):
        """Assigns what the clone assigned, except to `exclude`."""
        excluded = {id(v) for v in exclude}
        for key, variable in self.assigned.items():
            if key not in excluded:
                variable.assign(self.state_mapping[key])


class VariableCopies:
    """The copies of a `CloneModel`'s trainable variables and optimizer.

    With `broadcast=True` the copies have no optimizer: the model's
    optimizer updates its own variables and the copies take their new values
    (for optimizer state that must exist once, such as `AGNOptimizer`'s, or
    that a copy of the optimizer would not carry, such as which variables
    weight decay leaves out).

    Built when a training function is made. The copies take the model's
    values (and the optimizer's state) before the first step after
    `mark_stale()`, which `CloneModel` calls whenever it makes a training
    function (each `fit`, each `train_on_batch`): weights loaded before, or
    by `BackupAndRestore` as training begins, reach every copy.
    """

    def __init__(self, model, broadcast=False):
        deployment = model.deployment
        self.devices = [
            deployment.clone_device(i) for i in range(deployment.num_clones)
        ]
        self._cross_device_ops = deployment.cross_device_ops()
        # Groups one value per clone device for the cross-device ops.
        self._grouping = tf.distribute.MirroredStrategy(self.devices)
        self.optimizer = model.optimizer
        self.variables = [list(model.trainable_variables)]
        self.optimizers = [model.optimizer]
        with tf.init_scope():
            if not model.optimizer.built:
                # Built now, so that its state is there to copy.
                model.optimizer.build(self.variables[0])
            self._stale = tf.Variable(True, trainable=False, name="stale")
        for device in self.devices[1:]:
            with tf.device(device):
                copies = [
                    keras.Variable(
                        # A new variable (a variable would be wrapped).
                        tf.identity(v.value),
                        dtype=v.dtype,
                        trainable=True,
                        name=f"{v.name}_copy",
                    )
                    for v in self.variables[0]
                ]
                if not broadcast:
                    optimizer = type(model.optimizer).from_config(
                        model.optimizer.get_config()
                    )
                    optimizer.build(copies)
                    _check_same_state(model.optimizer, optimizer)
                    self.optimizers.append(optimizer)
            self.variables.append(copies)

    def mark_stale(self):
        """The copies take the model's values before the next step."""
        self._stale.assign(True)

    def sync_if_stale(self):
        def sync():
            for i in range(1, len(self.devices)):
                pairs = list(zip(self.variables[0], self.variables[i]))
                if len(self.optimizers) > 1:
                    pairs += list(
                        zip(
                            self.optimizers[0].variables,
                            self.optimizers[i].variables,
                        )
                    )
                self._assign(i, pairs)
            return tf.constant(True)

        tf.cond(self._stale, sync, lambda: tf.constant(False))
        self._stale.assign(False)

    def _assign(self, clone_index, pairs):
        with tf.device(self.devices[clone_index]):
            for source, copy in pairs:
                copy.assign(source)

    def scope(self, clone_index):
        """Where clone `clone_index` reads its copies (None for clone 0)."""
        if clone_index == 0:
            return None
        return _CopyScope(
            list(zip(self.variables[0], self.variables[clone_index]))
        )

    def all_reduce(self, clone_grads):
        """Sums the clones' gradients onto every clone device.

        Args:
            clone_grads: One list of gradients per clone (clone `i`'s with
                respect to its copies), with `None` for no gradient.

        Returns:
            One list of summed gradients per clone, each on its device.
        """
        summed = [[None] * len(clone_grads[0]) for _ in clone_grads]
        pairs, positions = [], []

        for k, grads in enumerate(zip(*clone_grads)):
            if any(g is None for g in grads):
                continue
            value = self._grouping.experimental_distribute_values_from_function(
                lambda context, grads=grads: grads[
                    context.replica_id_in_sync_group
                ]
            )
            pairs.append((value, value))
            positions.append(k)
        if not pairs:
            return summed
        reduced = self._cross_device_ops.batch_reduce(
            tf.distribute.ReduceOp.SUM, pairs
        )
        for k, value in zip(positions, reduced):
            for i, grad in enumerate(
                self._grouping.experimental_local_results(value)
            ):
                summed[i][k] = grad
        return summed

    def update(self, clone_grads):
        """Every copy takes one update of its summed gradients
        (`all_reduce`'s result).

        Clone 0's, to the model's own variables, go through the model's
        optimizer as usual; the copies' optimizers follow its learning rate,
        or, with `broadcast`, the copies take the updated values.
        """
        self.optimizer.apply(clone_grads[0], self.variables[0])
        if len(self.optimizers) == 1:
            for i in range(1, len(self.devices)):
                self._assign(i, zip(self.variables[0], self.variables[i]))
            return
        learning_rate = self.optimizer.learning_rate
        for i in range(1, len(self.devices)):
            optimizer = self.optimizers[i]
            if isinstance(learning_rate, keras.Variable):
                # A callback may have set it (a schedule is followed alike).
                optimizer.learning_rate.assign(learning_rate)
            with tf.device(self.devices[i]):
                optimizer.apply(clone_grads[i], self.variables[i])


def copies_for(model, copies):
    """The `VariableCopies` `model` trains with now, marked stale (to sync
    before a step): `copies` while they still fit its deployment,
    optimizer and variables, else new ones; None without replicated
    variables."""
    deployment = model.deployment
    if (
        deployment.variable_update != "replicated"
        or deployment.num_clones == 1
        or model.optimizer is None
        or not model.trainable_variables
    ):
        return None
    if model.distribute_strategy.num_replicas_in_sync > 1:
        raise NotImplementedError(
            "`variable_update='replicated'` does not train across "
            "workers yet. Use `variable_update='parameter_server'` "
            "under MultiWorkerMirroredStrategy."
        )
    if (
        copies is None
        or copies.optimizer is not model.optimizer
        or list(map(id, copies.variables[0]))
        != list(map(id, model.trainable_variables))
    ):
        # Else the copies take the model's updated weights.
        broadcast = not optimizer_capabilities.copies_can_apply(model.optimizer)
        copies = VariableCopies(model, broadcast=broadcast)
    copies.mark_stale()
    return copies


def _check_same_state(optimizer, copy):
    """Raises unless `copy` has `optimizer`'s variables, in the same order."""
    shapes = [[tuple(v.shape) for v in o.variables] for o in (optimizer, copy)]
    if shapes[0] != shapes[1]:
        raise ValueError(
            f"The {type(optimizer).__name__} of a replicated CloneModel "
            "cannot be copied onto the other clone devices: a copy made "
            "from its config has other state (variable shapes "
            f"{shapes[1]} instead of {shapes[0]}). Use "
            "`variable_update='parameter_server'`."
        )
