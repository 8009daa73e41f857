"""An `AGNOptimizer`'s fragments: each a slice of the weights that commits
on its own, with its commit in flight, its phase and its outer rule; what
a period's end reads of it and keeps, and with overlapped commits its
send, receive and mix (the period engine, `engine.py`, calls them).

Plain AGN is one fragment of whole variables, which the outer optimizer
(a Keras optimizer) updates as it would the model's (`keras_outer`, or
`delayed_nesterov` under parameter servers). `fragments=F` (Streaming
DiLoCo's fragments, arXiv 2501.18512) cuts the weights of the variables,
in order and flattened, at F equal shares of the bytes, inside a variable
where a cut falls there (in the slow-link bench's MLP one kernel holds 75%
of the weights): each fragment is then one flat slice, with the outer
optimizer run on its values (`slice_outer`). So with fragments the outer
optimizer must update each element on its own (SGD, Adam, RMSprop,
Lion...: not Lamb, Muon or Adafactor, and without weight decay or norm
clipping, which look at whole variables).
"""

import keras
import numpy as np

from keras_clones import gradients
from keras_clones.agn import core

NOTHING, SENT, RECEIVED = 0, 1, 2  # A fragment's in-flight phases.


class WholeVariables:
    """A slice of whole variables: values go as they are, one per
    variable."""

    def __init__(self, count):
        self._indices = tuple(range(count))

    def touched(self):
        return self._indices

    def gather(self, values):
        return [gradients.read(v) for v in values]

    def zeros(self, variables):
        return [keras.ops.zeros(v.shape, v.dtype) for v in variables]

    def assign_here(self, variables, parts):
        for variable, part in zip(variables, parts):
            variable.assign(gradients.copied(part))

    def assign(self, replicas, variables, parts):
        for variable, part in zip(variables, parts):
            replicas.assign(variable, part)


class FlatPieces:
    """A flat slice of the variables' weights: `pieces`, a list of
    (variable index, first flat element, end); values go as one flat
    tensor."""

    def __init__(self, pieces):
        self.pieces = pieces
        self.size = sum(end - start for _, start, end in pieces)

    def touched(self):
        return [index for index, _, _ in self.pieces]

    def gather(self, values):
        return [
            keras.ops.concatenate(
                [
                    keras.ops.reshape(values[index], [-1])[start:end]
                    for index, start, end in self.pieces
                ],
                0,
            )
        ]

    def zeros(self, variables):
        return [keras.ops.zeros([self.size], variables[0].dtype)]

    def _replaced(self, value, index, flat):
        """`value` (a variable's tensor) with its piece taken from
        `flat`."""
        offset = 0
        for piece_index, start, end in self.pieces:
            if piece_index == index:
                old = keras.ops.reshape(value, [-1])
                new = flat[offset : offset + end - start]
                return keras.ops.reshape(
                    keras.ops.concatenate([old[:start], new, old[end:]], 0),
                    keras.ops.shape(value),
                )
            offset += end - start
        raise AssertionError(f"No piece of variable {index}.")

    def assign_here(self, variables, parts):
        (flat,) = parts
        for index in self.touched():
            variable = variables[index]
            variable.assign(self._replaced(variable.value, index, flat))

    def assign(self, replicas, variables, parts):
        (flat,) = parts
        for index in self.touched():

            def piece(var, flat, index=index):
                return var.assign(self._replaced(var, index, flat))

            replicas.update(variables[index], piece, flat)


def cut(variables, count):
    """`variables`' weights cut into `count` flat slices of similar size,
    in order (`FlatPieces`)."""
    sizes = [int(np.prod(v.shape)) for v in variables]
    total = sum(sizes)
    bounds = [round(total * f / count) for f in range(count + 1)]
    slices = []
    for low, high in zip(bounds, bounds[1:]):
        pieces, offset = [], 0
        for index, size in enumerate(sizes):
            start, end = max(low, offset), min(high, offset + size)
            if start < end:
                pieces.append((index, start - offset, end - offset))
            offset += size
        slices.append(FlatPieces(pieces))
    return slices


class Fragment:
    """One fragment: its slice of the weights (`WholeVariables` or
    `FlatPieces`) over `states` (the `state.VariableState`s of the
    variables that have centers); its outer `rule`, which moves its centers
    (`keras_outer.KerasOuter` and the others it names); with overlapped
    commits, its in-flight `phase` (a variable: `NOTHING`, `SENT` or
    `RECEIVED`)."""

    def __init__(self, part, states, rule, phase=None):
        self.part = part
        self.states = list(states)
        self.rule = rule
        self.phase = phase

    @property
    def whole(self):
        return isinstance(self.part, WholeVariables)

    def over(self, variables):
        """This fragment of whole variables, over `variables` only (those
        a step has gradients for)."""
        ids = {id(v) for v in variables}
        states = [s for s in self.states if id(s.variable) in ids]
        if len(states) == len(self.states):
            return self
        return Fragment(WholeVariables(len(states)), states, self.rule)

    def field(self, name):
        """The fragment's variables of `VariableState` field `name`."""
        return [getattr(s, name) for s in self.states]

    def gather(self, name, read=gradients.tf_variable):
        """The fragment's values of field `name`, as its slice holds them
        (read in a replica: its own), each variable read by `read`."""
        return self.part.gather([read(v) for v in self.field(name)])

    def assign_here(self, name, parts):
        """Assigns `parts` to the fragment of field `name`, on this replica
        only (variables a replica holds alone)."""
        self.part.assign_here(self.field(name), parts)

    def assign(self, replicas, name, parts):
        """Assigns `parts` (per replica, or the same) to the fragment of
        field `name` (cross-replica, on `replicas`)."""
        self.part.assign(replicas, self.field(name), parts)

    def variables_written(self):
        """Every variable the end of the fragment's period may assign: its
        fields, its outer optimizer's state and its phase."""
        fields = ("center", "variable", "accumulator", "in_flight")
        written = [
            v
            for name in (*fields, "period_start", "residual")
            for v in self.field(name)
            if v is not None
        ]
        written += self.rule.variables
        if self.phase is not None:
            written.append(self.phase)
        return written

    def size(self):
        """The number of weights in the fragment's commit."""
        if self.whole:
            return sum(int(np.prod(v.shape)) for v in self.field("variable"))
        return self.part.size

    def checked_variables(self):
        """The variables a guard names for this fragment's commit."""
        centers = self.field("center")
        if self.whole:
            return centers
        return [centers[self.part.touched()[0]]]

    def move_centers(self, reduced, replicas, applied=None):
        """In a replica of `replicas` (or on the parameter servers'
        coordinator): the workers' `reduced` commit moves the fragment's
        centers by its outer rule, unless `applied` (a guard's verdict, a
        boolean scalar; None: always) is false."""
        self.rule.move(self, reduced, replicas, applied)

    # What a period's end reads and keeps, as the core's values.

    def period_state(self, config, commits=True):
        """In a replica: the fragment's `core.State` as a period's end
        reads it under `config`: what `core.commit` takes (unless not
        `commits`: the step's gradients are the commit), and the residuals
        where they feed back."""
        state = self._commit_reads(config) if commits else core.State()
        if config.quantized and config.error_feedback:
            state = state._replace(residuals=self.gather("residual"))
        return state

    def _commit_reads(self, config):
        """In a replica: the `core.State` that `core.commit` reads, by the
        rule."""
        if config.commit == "gradients":
            return core.State(accumulators=self.gather("accumulator"))
        if config.overlap:
            return core.State(
                weights=self.gather("variable"),
                period_starts=self.gather("period_start"),
            )
        return core.State(
            weights=self.gather("variable"), centers=self.gather("center")
        )

    def keep(self, state):
        """In a replica: the fragment's accumulators (where a commit
        restarted them) and residuals (with error feedback), as `state`
        holds them after a period's end."""
        if state.accumulators is not None:
            self.assign_here("accumulator", state.accumulators)
        if state.residuals is not None:
            self.assign_here("residual", state.residuals)

    # Overlapped commits: the fragment's send, receive and mix.

    def send(self, config):
        """In a replica: this worker's commit of the period by `config`'s
        rule, as it travels, into its slots of the commit in flight."""
        state, values = core.commit(config, self.period_state(config))
        values, residuals = core.with_feedback(config, values, state.residuals)
        self.assign_here("in_flight", values)
        self.keep(state._replace(residuals=residuals))

    def receive(self, config, replicas):
        """Cross-replica: all-reduces the commit in flight in place, if only
        sent."""

        def receive():
            replicas.for_each_replica(self._reduce_in_flight, config, replicas)
            self.phase.assign(RECEIVED)

        replicas.run_if(keras.ops.equal(self.phase, SENT), receive)

    def _reduce_in_flight(self, config, replicas):
        sent = self.gather("in_flight", read=replicas.read_own)
        self.assign_here("in_flight", core.reduced(config, sent, replicas))

    def mix(self, config, replicas, towards):
        """Cross-replica: the local weights become `mixing * local + (1 -
        mixing) * towards` (per replica: the look-ahead, or the centers;
        then constrained); the period's start moves with them, so that the
        commit is only what the local steps did."""

        def mix_on_replica(towards):
            local = self.gather("variable")
            return local, core.mixed(config, local, towards)

        before, mixed = replicas.for_each_replica(mix_on_replica, towards)
        self.assign(replicas, "variable", mixed)
        self._constrain(replicas)
        if config.commit == "weight_change":

            def moved_start(before):
                starts = self.gather("period_start")
                local = self.gather("variable")
                return core.moved_starts(starts, local, before)

            moved = replicas.for_each_replica(moved_start, before)
            self.assign(replicas, "period_start", moved)

    def _constrain(self, replicas):
        """The constraints of the variables the fragment touches."""
        variables = self.field("variable")
        for index in self.part.touched():
            variable = variables[index]
            if variable.constraint is None:
                continue
            value = replicas.for_each_replica(
                lambda v: v.constraint(gradients.read(v)),
                variable,
            )
            replicas.assign(variable, value)
