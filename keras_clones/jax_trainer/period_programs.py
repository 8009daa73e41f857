"""An `AGNOptimizer`'s period ends kept out of the steps that end none,
under Keras's JAX trainer: one compiled program per answer to "whose
period does this step end?", chosen on the host.

Asked in the step, a period's end is a conditional, which XLA compiles on
a GPU as a copy of every value its untaken branch passes through: the
weights and the centers, every step (bench/RESULTS.md, "Where the time
goes: XLA's conditionals copy what they pass through"). So the train
function of a model compiled with an `AGNOptimizer` (Keras's
`make_train_function`, in one process) traces Keras's `train_step` once
per answer instead, each inside `TrainerSeams.steps_ending`: a program
that ends no period (most steps), and one for each fragment whose period
ends, each compiled the first time it runs. The host knows the local
step: it reads it from the state where that is not the state its last
step returned, and counts one a step from there, as the optimizer counts
(a step a guard skips included).

It acts where that count holds: Keras's own `train_step` (one local step
each), the model's optimizer the `AGNOptimizer` itself (a
`LossScaleOptimizer` around one leaves out the steps it skips, uncounted),
a period longer than 1, and compiled steps with no `keras.distribution`.
Elsewhere Keras's own train function runs, with the conditionals in the
step. Across JAX processes `jax_trainer.train_function` counts the
local step here too (`LocalStepCount`).
"""

import contextlib

import jax
import keras

from keras_clones.agn.optimizer import AGNOptimizer


def counted_optimizer(model):
    """The `AGNOptimizer` whose local steps the host can count for
    `model`'s train function, one a step: Keras's own `train_step` (not
    the class's nor the instance's), the optimizer itself with
    `AGNOptimizer`'s own `apply` and Keras's `stateless_apply`, a period
    longer than 1; else None."""
    optimizer = model.optimizer
    keras_step = getattr(model.train_step, "__func__", None)
    if (
        isinstance(optimizer, AGNOptimizer)
        and type(optimizer).apply is AGNOptimizer.apply
        and type(optimizer).stateless_apply
        is keras.optimizers.Optimizer.stateless_apply
        and optimizer.core_config.local
        and keras_step is keras.Model.train_step
    ):
        return optimizer
    return None


def train_function(model):
    """`model`'s train function of period-end programs in one process, as
    Keras's JAX trainer calls it (`(state, iterator) -> (logs, state)`), or
    None where it does not act (see the module's docstring)."""
    optimizer = counted_optimizer(model)
    acts = (
        optimizer is not None
        and model.jit_compile
        and not model.run_eagerly
        and keras.distribution.distribution() is None
        and not keras.config.is_nnx_enabled()
    )
    return ProgramsByPeriodEnd(model, optimizer) if acts else None


def traced_for(optimizer, ending):
    """The context to trace steps ending the periods of `ending` in: the
    optimizer's `steps_ending`; none where `ending` is None (unknown: the
    step asks)."""
    if ending is None:
        return contextlib.nullcontext()
    return optimizer.trainer_seams.steps_ending(ending)


class LocalStepCount:
    """An `AGNOptimizer`'s local step as the host counts it over the states
    of Keras's JAX trainer (`(trainable, non-trainable, optimizer, metrics)`
    variables' values): read from a state that is not the one the last
    steps returned, else counted one a step.

    Args:
        optimizer: The `AGNOptimizer` (built by the first call).
        read: Reads an int from the local step's array in a state.
    """

    def __init__(self, optimizer, read=int):
        self._optimizer = optimizer
        self._read = read
        self._index = None  # The local step's place in the state.
        self._last = None  # The local step the last steps returned, counted.

    def endings(self, state, steps):
        """For each of the next `steps` steps from `state`, the fragments
        whose periods it ends (a tuple)."""
        if self._index is None:
            self._index = self._local_step_index()
        before = state[2][self._index]
        if self._last is not None and self._last[0] is before:
            step = self._last[1]
        else:
            step = self._read(before)  # Set elsewhere since: read once.
        self._last = (None, step + steps)
        config = self._optimizer.core_config
        return [
            tuple(f for f, ends in config.ending(s) if ends)
            for s in range(step + 1, step + steps + 1)
        ]

    def _local_step_index(self):
        """The local step's place among the optimizer's variables (a
        `RuntimeError` if it has none there: not a `StopIteration`, which
        Keras's loop would take for the end of the data)."""
        local_step = self._optimizer.local_step
        for index, variable in enumerate(self._optimizer.variables):
            if variable is local_step:
                return index
        raise RuntimeError(
            f"The local step of {self._optimizer.name!r} is not among its "
            "`variables`, so its steps cannot be counted: the state Keras's "
            "JAX trainer carries would not hold it. Report this as a bug "
            "of keras_clones."
        )

    def returned(self, state):
        """The state the steps counted by the last `endings` returned."""
        self._last = (state[2][self._index], self._last[1])


class ProgramsByPeriodEnd:
    """A train function that runs each step in the program of the periods
    it ends (see the module's docstring).

    Args:
        model: The model, whose `train_step` the programs trace.
        optimizer: Its `AGNOptimizer`.
    """

    def __init__(self, model, optimizer):
        self._model = model
        self._optimizer = optimizer
        self._count = LocalStepCount(optimizer)
        self.programs = {}  # The fragments whose periods end: the program.

    def __call__(self, state, iterator):
        # As Keras's: `steps_per_execution` steps, fewer where the data ends.
        logs, state = self._step(state, next(iterator))
        for _ in range(self._model.steps_per_execution - 1):
            try:
                batch = next(iterator)
            except StopIteration:
                break
            logs, state = self._step(state, batch)
        return logs, state

    def _step(self, state, batch):
        (ending,) = self._count.endings(state, 1)
        logs, state = self._program(ending)(state, batch)
        self._count.returned(state)
        return logs, state

    def _program(self, ending):
        """The compiled step that ends the periods of `ending` alone."""
        program = self.programs.get(ending)
        if program is None:
            model, optimizer = self._model, self._optimizer

            def step(state, batch):
                with optimizer.trainer_seams.steps_ending(ending):
                    return model.train_step(state, batch)

            program = jax.jit(step, donate_argnums=0)
            self.programs[ending] = program
        return program
