"""An `AGNOptimizer`'s state, as its `build` creates it: optimizer
variables (in a fixed order, the order of `variables`), gathered in one
record per model variable (`VariableState`) and in the
fragments."""

import typing

import keras
import ml_dtypes
import numpy as np

from keras_clones import _keras_internals as internals
from keras_clones import commit_bytes
from keras_clones import gradients
from keras_clones import replicas
from keras_clones.agn import delayed_nesterov
from keras_clones.agn import fragment
from keras_clones.agn import quantization
from keras_clones.agn.keras_outer import KerasOuter
from keras_clones.agn.slice_outer import SliceOuter

# Counters are 64 bits on TensorFlow; JAX (without `jax_enable_x64`) has
# 32-bit integers, as for Keras's own `iterations` ("int").
COUNTER_DTYPE = "int"


def _itemsize(dtype):
    """The bytes of one number of `dtype` (bfloat16 included)."""
    name = keras.backend.standardize_dtype(dtype)
    return np.dtype(getattr(ml_dtypes, name, name)).itemsize


def _slot_name(variable, what):
    """The name of an optimizer variable for `variable`, as Keras's
    `add_variable_from_reference` makes it."""
    name = gradients.variable_name(variable)
    return f"{name.replace('/', '_').replace(':', '_')}_{what}"


class VariableState(typing.NamedTuple):
    """AGN's state of one model variable (None where a rule keeps none)."""

    variable: object  # The model's (local) variable.
    center: object  # Its global center.
    accumulator: object  # Its gradient accumulator (`commit="gradients"`).
    in_flight: object  # Its slot of the commit in flight (`overlap=True`).
    period_start: object  # Its weights at its period's start (overlap,
    # `commit="weight_change"`).
    residual: object = None  # What quantization dropped from its last
    # commit (`error_feedback`).


class AGNState:
    """An `AGNOptimizer`'s state: `local_step`, `rounds`, the
    `VariableState` of each variable with a center (`states`), the
    `fragments`, and the local steps this worker skipped alone since the
    last commit (`skipped`, and the optimizer step of the first, or -1:
    `first_skipped`)."""

    def __init__(
        self, local_step, rounds, states, fragments, skipped, first_skipped
    ):
        self.local_step = local_step
        self.rounds = rounds
        self.states = states
        self.fragments = fragments
        self.skipped = skipped
        self.first_skipped = first_skipped
        self._of = {id(s.variable): s for s in states}

    def of(self, variable):
        """The `VariableState` of model variable `variable`, or None (a
        variable without one: it takes its gradient as its value)."""
        return self._of.get(id(variable))

    def lookup(self, variable, what, built_on):
        """The `VariableState` of model variable `variable`; where it has
        none, a `KeyError` that says why (`what` it was asked for, and
        `built_on`, the variables the optimizer was built on)."""
        state = self.of(variable)
        if state is None and not any(v is variable for v in built_on):
            raise KeyError(
                f"The AGNOptimizer has no {what} for variable "
                f"{gradients.variable_name(variable)!r}: it was built on "
                "other variables (those of the model it was compiled with)."
            )
        if state is None:
            raise KeyError(
                f"The AGNOptimizer has no {what} for variable "
                f"{gradients.variable_name(variable)!r}: it has "
                "`overwrite_with_gradient=True`, so it takes its gradient "
                "as its value, as with any Keras optimizer. Read the "
                "variable itself."
            )
        return state

    def centers_without_weight_decay(self, inner_optimizer):
        """The centers of the variables `inner_optimizer` leaves out of
        weight decay."""
        return [
            state.center
            for state in self.states
            if not internals.uses_weight_decay(inner_optimizer, state.variable)
        ]

    def bytes_per_round(self, communication_dtype):
        """The bytes of every weight that has a center, in
        `communication_dtype` (or None: its own dtype); quantized, each
        fragment's commit with its scales."""
        if quantization.quantizes(communication_dtype):
            return sum(
                commit_bytes.payload_bytes(f.size(), communication_dtype)
                for f in self.fragments
            )
        total = 0
        for state in self.states:
            dtype = communication_dtype or state.variable.dtype
            size = int(np.prod(state.variable.shape))
            total += size * _itemsize(dtype)
        return total

    def in_flight_phase(self):
        """The fragments' in-flight phases (0 without overlap), a scalar
        for one fragment, else a vector."""
        phases = [f.phase for f in self.fragments]
        if phases[0] is None:
            phases = [0] * len(phases)
        phases = [keras.ops.cast(p, COUNTER_DTYPE) for p in phases]
        if len(phases) == 1:
            return phases[0]
        return keras.ops.stack(phases)


class StateBuilder:
    """Creates the state of `optimizer` (an `AGNOptimizer`) through its
    `add_variable`."""

    def __init__(self, optimizer, global_devices):
        self.optimizer = optimizer
        self.add_variable = optimizer.add_variable
        self.add_variable_from_reference = optimizer.add_variable_from_reference
        self.name = optimizer.name
        self.config = optimizer.core_config
        self.outer_optimizer = optimizer.outer_optimizer
        self._global_devices = global_devices

    def build(self, var_list):
        """The optimizer's state for `var_list` (an `AGNState`)."""
        local_step = self.add_variable(
            shape=(), dtype=COUNTER_DTYPE, name="local_step"
        )
        rounds = self.add_variable(
            shape=(), dtype=COUNTER_DTYPE, name="communication_rounds"
        )
        # Variables Keras overwrites with their gradient have no AGN state,
        # as they have no slots in Keras's optimizers.
        centered = [v for v in var_list if not gradients.overwrites(v)]
        centers, accumulators = [], []
        for i, variable in enumerate(var_list):
            if not gradients.overwrites(variable):
                centers.append(self._add_center(variable, i))
                accumulators.append(
                    self._add_own(variable, "grad_accumulator")
                    if self.config.commit == "gradients"
                    else None
                )
        parts = self._cut(centered)
        rules = self._outer_rules(parts, centers)
        phases, in_flight, starts = self._add_overlap_state(centered)
        residuals = [None] * len(centered)
        if self.config.error_feedback:
            residuals = [self._add_own(v, "residual") for v in centered]
        states = [
            VariableState(*fields)
            for fields in zip(
                centered, centers, accumulators, in_flight, starts, residuals
            )
        ]
        fragments = [
            fragment.Fragment(part, states, rule, phase)
            for part, rule, phase in zip(parts, rules, phases)
        ]
        # The local steps this worker skipped alone since the last commit,
        # and the first one's optimizer step (the first worker's, read
        # outside a replica).
        skipped = self._add_replica_variable(
            "skipped_local_steps", (), "float32"
        )
        first_skipped = self._add_replica_variable(
            "first_skipped_local_step",
            (),
            COUNTER_DTYPE,
            aggregation="only_first_replica",
            initializer=keras.initializers.Constant(-1),
        )
        return AGNState(
            local_step, rounds, states, fragments, skipped, first_skipped
        )

    def _add_center(self, variable, index):
        device = self._global_devices[index % len(self._global_devices)]
        with replicas.this_backend().placed_on(device):
            center = self.add_variable(
                shape=variable.shape,
                dtype=variable.dtype,
                name=_slot_name(variable, "global_center"),
                # Under a `keras.distribution`, sharded as the variable.
                layout=internals.variable_layout(variable),
            )
        # The outer optimizer applies it after every update, as Keras's
        # optimizers apply a variable's constraint.
        center.constraint = variable.constraint
        # Else the first step copies it, as always (`_start_from_model`).
        if gradients.has_value(variable):
            center.assign(keras.ops.copy(variable))
        return center

    def _add_own(self, variable, what):
        """A variable each replica keeps its own of, shaped and placed as
        `variable`, with no communication (gradients summed, a commit in
        flight): read outside a replica (saving, `grad_variable(v).numpy()`)
        it is the sum over replicas. Restoring it gives every replica an
        equal share, which reduces to the same."""
        seam = replicas.this_backend()
        if not seam.per_replica_variables:  # One replica.
            return self.add_variable_from_reference(variable, what)
        with seam.colocated_with(self.optimizer, variable):
            return self._add_replica_variable(
                _slot_name(variable, what), variable.shape, variable.dtype
            )

    def _add_replica_variable(
        self, name, shape, dtype, aggregation="sum", initializer="zeros"
    ):
        """An on-read variable of each replica's own (see `_add_own`);
        read outside a replica, its replicas' values reduced by
        `aggregation`."""
        with keras.name_scope(self.name):
            own = keras.Variable(
                initializer=initializer,
                shape=shape,
                dtype=dtype,
                trainable=False,
                synchronization="on_read",
                aggregation=aggregation,
                name=name,
            )
        internals.track_variable(self.optimizer, own)
        return own

    def _cut(self, centered):
        """Each fragment's slice: one of whole variables, or `fragments`
        flat slices."""
        if self.config.fragments == 1:
            return [fragment.WholeVariables(len(centered))]
        dtypes = {keras.backend.standardize_dtype(v.dtype) for v in centered}
        if len(dtypes) > 1 or not centered:
            raise ValueError(
                "`fragments` needs the trainable variables to have one "
                f"dtype, but they have the dtypes "
                f"{sorted(dtypes)}. Use `fragments=1`."
            )
        parts = fragment.cut(centered, self.config.fragments)
        if min(p.size for p in parts) == 0:
            raise ValueError(
                f"`fragments={self.config.fragments}` is more than the model's "
                f"{sum(p.size for p in parts)} weights. Use fewer fragments."
            )
        return parts

    def _outer_rules(self, parts, centers):
        """Each fragment's outer rule (see `keras_outer`): on each flat
        slice apart; for whole variables the delayed Nesterov rule where it
        is on, else Keras's stateful `apply`."""
        count = len(parts)
        if count > 1:
            dtype = keras.backend.standardize_dtype(centers[0].dtype)
            return [
                SliceOuter(
                    self.outer_optimizer,
                    part,
                    dtype,
                    f,
                    count,
                    self.add_variable,
                )
                for f, part in enumerate(parts)
            ]
        commits = delayed_nesterov.commits_per_step(
            self.optimizer.delayed_nesterov, self.outer_optimizer
        )
        if commits is not None:
            return [
                delayed_nesterov.DelayedNesterov(
                    self.outer_optimizer,
                    commits,
                    centers,
                    self.add_variable,
                    COUNTER_DTYPE,
                )
            ]
        return [KerasOuter(self.outer_optimizer)]

    def _add_overlap_state(self, centered):
        """With `overlap=True`: each fragment's phase, each variable's slot
        of the commit in flight and, for `commit="weight_change"`, its
        period's start; else None for each."""
        nothing = [None] * len(centered)
        if not self.config.overlap:
            return [None] * self.config.fragments, nothing, nothing
        names = ["in_flight_phase"]
        if self.config.fragments > 1:
            names = [
                f"fragment_{f}_in_flight_phase"
                for f in range(self.config.fragments)
            ]
        phases = [
            self.add_variable(shape=(), dtype=COUNTER_DTYPE, name=name)
            for name in names
        ]
        in_flight = [self._add_own(v, "in_flight") for v in centered]
        starts = nothing
        if self.config.commit == "weight_change":
            starts = [self._add_period_start(v) for v in centered]
        return phases, in_flight, starts

    def _add_period_start(self, variable):
        start = self.add_variable_from_reference(variable, "period_start")
        if gradients.has_value(variable):
            start.assign(keras.ops.copy(variable))
        return start
