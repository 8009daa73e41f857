"""Delayed Nesterov: an outer SGD with momentum for commits that arrive one
worker at a time (Liu et al. 2024, "Asynchronous Local-SGD Training for
Language Modeling", arXiv 2401.09135, Algorithm 3 with c = 0).

Under parameter servers the coordinator applies each worker's commit as it
arrives. Keras's SGD with momentum would take a momentum step for every
one of them: with N workers, N momentum steps where synchronous training
takes one, which amplifies the weights' change while the momentum decays,
and diverges. The delayed rule takes the momentum step once every N
commits, on their mean. In Keras's SGD's terms (velocity `m`, momentum
`b`, learning rate `lr`, a buffer `d`):

- every commit `g`: `d += g`, and the centers move by `-lr * g / N`;
- every N-th commit, also: `m = b * m - lr * d / N`, the centers move by
  `b * m` (Nesterov; without Nesterov by `b * m` before the update), `d`
  restarts from zero, and the outer SGD counts one step.

With N workers committing in turn this is Keras's SGD with momentum on
the mean of each round's N commits (the paper's footnote 5): synchronous
DiLoCo. A commit a guard (`InfNanCheck`) skips is not applied, and does
not count toward N.
"""

import keras

from keras_clones import _keras_internals as internals
from keras_clones import gradients
from keras_clones import replicas
from keras_clones.agn import core
from keras_clones.tensor_optimizer import TensorOptimizer

# The outer SGD's options the rule does not take (it runs SGD's update
# itself), with their defaults.
_SGD_OPTIONS = {
    "weight_decay": None,
    "clipnorm": None,
    "clipvalue": None,
    "global_clipnorm": None,
    "use_ema": False,
    "loss_scale_factor": None,
    "gradient_accumulation_steps": None,
}


def check_setting(delayed_nesterov, outer_optimizer, fragments, overlap):
    """Refuses a `delayed_nesterov` argument an `AGNOptimizer` cannot
    honour."""
    if delayed_nesterov is None or delayed_nesterov is False:
        return
    if (
        isinstance(delayed_nesterov, bool)
        or not isinstance(delayed_nesterov, int)
        or delayed_nesterov < 1
    ):
        raise ValueError(
            "`delayed_nesterov` must be None (the default: on with more "
            "than one parameter-server worker, N = the workers), False "
            "(off) or N, an integer >= 1: the commits per momentum step. "
            f"Received: delayed_nesterov={delayed_nesterov!r}."
        )
    if delayed_nesterov == 1:
        return  # Keras's SGD itself.
    _check_outer(outer_optimizer, f"delayed_nesterov={delayed_nesterov}")
    if fragments > 1 or overlap:
        raise ValueError(
            "`delayed_nesterov` applies the commits of whole periods as "
            "they arrive, one worker's at a time; it does not take "
            "`fragments` or `overlap`. Received: "
            f"delayed_nesterov={delayed_nesterov}, fragments={fragments}, "
            f"overlap={overlap}. Leave `delayed_nesterov` out, or use "
            "`fragments=1` and `overlap=False`."
        )


def commits_per_step(delayed_nesterov, outer_optimizer):
    """N, the commits per momentum step, or None where the rule is off:
    `delayed_nesterov` itself where given (1: off); by default, under a
    `ParameterServerStrategy` with more than one worker and an outer SGD
    with momentum, the number of workers. Refuses a synchronous strategy
    of several replicas, which averages the workers' commits itself."""
    if delayed_nesterov is False or delayed_nesterov == 1:
        return None
    strategy = replicas.this_backend().strategy()
    workers = _parameter_server_workers(strategy)
    if delayed_nesterov is None:
        if workers < 2 or not _has_momentum(outer_optimizer):
            return None
        _check_outer(
            outer_optimizer,
            f"an outer SGD with momentum on {workers} parameter-server "
            "workers (delayed Nesterov, by default)",
        )
        return workers
    if not workers and strategy and strategy.num_replicas_in_sync > 1:
        raise ValueError(
            "`delayed_nesterov` is for commits that arrive one worker "
            "at a time (parameter servers), but under "
            f"{type(strategy).__name__} the workers' commits are "
            "averaged together, and the outer SGD applies their mean. "
            f"Received: delayed_nesterov={delayed_nesterov}. Leave it "
            "out."
        )
    return delayed_nesterov


def _parameter_server_workers(strategy):
    """The workers of `strategy` if it is a `ParameterServerStrategy`,
    else 0."""
    if strategy is None:
        return 0
    # Imported here: parameter-server training imports AGN.
    from keras_clones.parameter_server import cluster

    if not cluster.is_parameter_server(strategy):
        return 0
    return cluster.num_workers(strategy)


def _has_momentum(outer_optimizer):
    """Whether `outer_optimizer` is Keras's SGD with momentum."""
    return isinstance(outer_optimizer, keras.optimizers.SGD) and bool(
        outer_optimizer.momentum
    )


def _check_outer(outer_optimizer, what):
    received = type(outer_optimizer).__name__
    if isinstance(outer_optimizer, keras.optimizers.SGD):
        received += f"(momentum={outer_optimizer.momentum})"
    if not _has_momentum(outer_optimizer):
        raise ValueError(
            f"{what} needs the outer optimizer to be "
            "`keras.optimizers.SGD` with momentum > 0 (no such rule exists "
            f"for others). Received: outer_optimizer={received}. "
            "Pass e.g. `outer_optimizer=keras.optimizers.SGD(0.7, "
            "momentum=0.9, nesterov=True)`, or `delayed_nesterov=False`."
        )
    for option, default in _SGD_OPTIONS.items():
        value = getattr(outer_optimizer, option, default)
        if value != default:
            raise ValueError(
                f"{what} runs the outer SGD's momentum update itself, "
                f"without its `{option}`. Received: {option}={value!r}. "
                f"Create the outer SGD without `{option}`, or pass "
                "`delayed_nesterov=False` to apply Keras's SGD to each "
                "commit as it arrives."
            )


class DelayedNesterov:
    """The outer rule over the centers of an `AGNOptimizer` whose outer
    optimizer is `outer` (a built `keras.optimizers.SGD` with momentum,
    whose velocity and step count it uses), for `commits` commits per
    momentum step (see `keras_outer` for what every outer rule has). Its
    own state, a buffer per center and the commits since the last momentum
    step, are variables made by `add_variable` (the AGNOptimizer's: saved
    with it, last: a file saved without them, on another number of
    workers, loads with the rule's state afresh)."""

    state_saved_last = True

    def __init__(self, outer, commits, centers, add_variable, counter_dtype):
        self.outer = outer
        self.commits = commits
        self._sums = {
            id(center): add_variable(
                shape=center.shape,
                dtype=center.dtype,
                name=f"{center.name}_delayed_sum",
                layout=internals.variable_layout(center),
            )
            for center in centers
        }
        self.count = add_variable(
            shape=(), dtype=counter_dtype, name="delayed_nesterov_commits"
        )

    @property
    def state_variables(self):
        """The rule's own state: a buffer per center, then the count."""
        return [*self._sums.values(), self.count]

    @property
    def variables(self):
        """Every variable a commit may assign: the outer SGD's and the
        rule's own."""
        return [*self.outer.variables, *self.state_variables]

    def move(self, fragment, reduced, replicas, applied):
        """On values, the skip as data (`core.apply`); then the centers and
        the state are assigned (parameter servers: on the coordinator)."""
        centers = fragment.field("center")
        state = core.apply(
            core.State(
                centers=[gradients.read(c) for c in centers],
                outer=self.read_state(centers),
            ),
            reduced,
            lambda values, grads, state, _: self.step(
                values, grads, state, centers
            ),
            None,
            applied,
        )
        for center, value in zip(centers, state.centers):
            center.assign(value)
        self.assign_state(centers, state.outer)

    def on_worker(self, centers, where):
        """What a worker that replays its own commits assumes: the share
        every commit takes, no momentum step (`share`)."""
        outer = TensorOptimizer(self.outer, centers, where)
        return _SharedOnWorker(self, outer, centers)

    def read_state(self, centers):
        """The rule's state for `centers`, as values: the outer SGD's
        velocity and the rule's buffer per center, the commits since the
        last momentum step, and the outer SGD's step count."""
        return (
            [gradients.read(self._velocity(c)) for c in centers],
            [gradients.read(self._sums[id(c)]) for c in centers],
            gradients.read(self.count),
            gradients.read(self.outer.iterations),
        )

    def assign_state(self, centers, state):
        """Assigns `state` (as `read_state` gives it) to the variables."""
        velocities, sums, count, iterations = state
        for center, velocity, total in zip(centers, velocities, sums):
            self._velocity(center).assign(velocity)
            self._sums[id(center)].assign(total)
        self.outer.iterations.assign(iterations)
        self.count.assign(count)

    def step(self, values, commit, state, centers):
        """On values: one commit (a gradient per center) moves `values`
        (of `centers`) by the rule from `state` (as `read_state` gives
        it); every N-th also takes the momentum step. Returns the new
        values and state."""
        ops = keras.ops
        outer = self.outer
        velocities, sums, count, iterations = state
        count = count + 1
        due = count >= self.commits
        rate = gradients.read(outer.learning_rate)
        moved_values, new_velocities, new_sums = [], [], []
        for center, start, value, old, total in zip(
            centers, values, commit, velocities, sums
        ):
            dtype = center.dtype
            value = ops.cast(gradients.dense(value), dtype)
            summed = total + value
            momentum = ops.cast(outer.momentum, dtype)
            new = momentum * old - ops.cast(rate, dtype) * (
                summed / self.commits
            )
            push = momentum * (new if outer.nesterov else old)
            moved = self._shared(start, value, ops.cast(rate, dtype))
            moved = ops.where(due, moved + push, moved)
            if center.constraint is not None:
                moved = center.constraint(moved)
            moved_values.append(moved)
            new_velocities.append(ops.where(due, new, old))
            new_sums.append(ops.where(due, ops.zeros_like(summed), summed))
        iterations = iterations + ops.cast(due, iterations.dtype)
        count = ops.where(due, ops.zeros_like(count), count)
        return moved_values, (new_velocities, new_sums, count, iterations)

    def _velocity(self, center):
        return internals.slot(self.outer, "momentums", center)

    def share(self, values, commit, learning_rate, centers):
        """On tensors: the `values` of `centers` after the part of the rule
        every commit takes (`-lr * g / N`), at `learning_rate`: what a
        worker that replays its own commits assumes, since it cannot know
        which commit the coordinator will count N-th."""
        ops = keras.ops
        moved = []
        for value, grad, center in zip(values, commit, centers):
            dtype = value.dtype
            value = self._shared(
                value, ops.cast(grad, dtype), ops.cast(learning_rate, dtype)
            )
            if center.constraint is not None:
                value = center.constraint(value)
            moved.append(value)
        return moved

    def _shared(self, center, grad, rate):
        """`center` after the part of the rule every commit takes:
        `center - rate * grad / N`."""
        return center - rate * grad / self.commits


class _SharedOnWorker:
    """`DelayedNesterov.on_worker`: the outer SGD on values (its state and
    learning rate), stepping by the rule's `share`."""

    def __init__(self, rule, outer, centers):
        self._rule = rule
        self._outer = outer
        self._centers = centers
        self.read_source_state = outer.read_source_state
        self.iteration = outer.iteration

    def step(self, centers, received, state, iteration):
        rate = self._outer.learning_rate(iteration)
        return self._rule.share(centers, received, rate, self._centers), state
