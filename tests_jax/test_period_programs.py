"""`keras_clones.jax_trainer.period_programs`: under Keras's JAX trainer an
`AGNOptimizer`'s period ends are programs of their own, chosen on the host,
and train bit for bit as the period end asked in each step (a conditional:
Keras's own train function, which a model of its own `train_step` runs)."""

import os
import subprocess
import sys

import jax
import keras
import numpy as np
import pytest

from keras_clones import AGNOptimizer
from keras_clones.callbacks import InfNanCheck
from keras_clones.jax_trainer.period_programs import ProgramsByPeriodEnd

BATCH, BATCHES = 4, 10


class PeriodEndInStep(keras.Sequential):
    """Its own `train_step` (Keras's): Keras's train function runs it, with
    the period end a conditional in every step."""

    def train_step(self, state, data):
        return super().train_step(state, data)


def data(nan_batch=None):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(BATCH * BATCHES, 5)).astype("float32")
    y = np.tanh(x @ rng.normal(size=(5, 2))).astype("float32")
    if nan_batch is not None:
        x[nan_batch * BATCH, 0] = np.nan
    return x, y


def compiled(in_step, steps_per_execution=1, **options):
    keras.backend.clear_session()  # The same layer names every time.
    keras.utils.set_random_seed(6)
    model = (PeriodEndInStep if in_step else keras.Sequential)(
        [
            keras.Input((5,)),
            keras.layers.Dense(4, activation="tanh"),
            keras.layers.Dense(2),
        ]
    )
    optimizer = AGNOptimizer(
        keras.optimizers.Adam(0.01),
        4,
        outer_optimizer=keras.optimizers.SGD(0.5, momentum=0.9),
        **options,
    )
    model.compile(optimizer, "mse", steps_per_execution=steps_per_execution)
    return model


def state_of(model):
    """The model's and its optimizer's variables, as arrays."""
    variables = model.weights + model.optimizer.variables
    return [keras.ops.convert_to_numpy(v) for v in variables]


RECIPES = {
    "plain": ({}, None),
    "fragments and overlap": ({"fragments": 2, "overlap": True}, None),
    "weight change, int8": (
        {"commit": "weight_change", "communication_dtype": "int8"},
        None,
    ),
    "a skipped step, fragments": ({"fragments": 2}, 5),
}


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_period_end_programs_train_bit_for_bit_as_the_period_end_in_the_step(
    recipe, steps_per_execution
):
    options, nan_batch = RECIPES[recipe]
    x, y = data(nan_batch)
    states = []
    for in_step in (True, False):
        model = compiled(in_step, steps_per_execution, **options)
        # 10 batches an epoch: with 3 steps an execution, the last has 1.
        checks = [InfNanCheck("skip")] if nan_batch is not None else []
        history = model.fit(
            x,
            y,
            batch_size=BATCH,
            epochs=2,
            shuffle=False,
            verbose=0,
            callbacks=checks,
        )
        programs = isinstance(model.train_function, ProgramsByPeriodEnd)
        assert programs is not in_step
        states.append(state_of(model))
        if checks:
            assert history.history["skipped_steps"] == [1.0, 1.0]
    assert int(model.optimizer.communication_rounds.numpy()) == (
        2 * BATCHES // 4 * options.get("fragments", 1)
    )
    for in_step, programs in zip(*states, strict=True):
        np.testing.assert_array_equal(in_step, programs)


def test_inf_nan_check_stops_at_the_same_step_with_the_same_failure(capsys):
    # The guard numbers its checks as they are traced, over every program.
    x, y = data(nan_batch=6)
    printed = []
    for in_step in (True, False):
        model = compiled(in_step, fragments=2)
        model.fit(
            x,
            y,
            batch_size=BATCH,
            shuffle=False,
            verbose=0,
            callbacks=[InfNanCheck("stop")],
        )
        printed.append(capsys.readouterr().out.replace(model.name, "model"))
        assert int(model.optimizer.iterations.numpy()) == 7
    assert "kernel is not finite at optimizer step 6" in printed[0]
    assert printed[0] == printed[1]


def test_the_local_step_set_between_fits_is_read_again():
    # The host counts the local step from what its last step returned; one
    # set since (a restore, by hand here) is read from the state.
    x, y = data()
    states = []
    for in_step in (True, False):
        model = compiled(in_step, fragments=2)
        model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)
        model.optimizer.local_step.assign(1)
        model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)
        for _ in range(3):
            model.train_on_batch(x[:BATCH], y[:BATCH])
        states.append(state_of(model))
    assert int(model.optimizer.local_step.numpy()) == 1 + BATCHES + 3
    for in_step, programs in zip(*states, strict=True):
        np.testing.assert_array_equal(in_step, programs)


def conditionals(model, program):
    """The conditionals in the jaxpr of one of `model`'s step programs."""
    x, y = data()
    state = tuple(
        [v.value for v in variables]
        for variables in (
            model.trainable_variables,
            model.non_trainable_variables,
            model.optimizer.variables,
            model.metrics_variables,
        )
    )
    jaxpr = jax.make_jaxpr(program)(state, (x[:BATCH], y[:BATCH]))
    return str(jaxpr).count("cond[")


def test_a_step_ends_periods_with_no_conditional():
    x, y = data()
    model = compiled(False, fragments=2)
    model.fit(x, y, batch_size=BATCH, verbose=0)
    programs = model.train_function.programs
    assert sorted(programs) == [(), (0,), (1,)]
    for program in programs.values():
        assert conditionals(model, program) == 0
    in_step = compiled(True, fragments=2)
    in_step.fit(x, y, batch_size=BATCH, verbose=0)
    asked = jax.jit(in_step.train_step)
    assert conditionals(in_step, asked) == 2  # One a fragment.


def test_what_the_count_cannot_follow_runs_keras_own_train_function():
    x, y = data()
    scaled = compiled(False)
    scaled.compile(keras.optimizers.LossScaleOptimizer(scaled.optimizer))
    period_one = compiled(False)
    period_one.compile(AGNOptimizer(keras.optimizers.SGD(0.1), 1), "mse")
    eager = compiled(False)
    eager.compile(eager.optimizer, "mse", run_eagerly=True)

    class OwnApply(AGNOptimizer):
        def apply(self, grads, trainable_variables=None):
            super().apply(grads, trainable_variables)

    own_apply = compiled(False)
    own_apply.compile(OwnApply(keras.optimizers.SGD(0.1), 4), "mse")
    for model in (scaled, period_one, eager, own_apply):
        model.fit(x, y, batch_size=BATCH, verbose=0, steps_per_epoch=2)
        assert not isinstance(model.train_function, ProgramsByPeriodEnd)


def test_a_train_step_set_on_the_instance_is_run_as_keras_runs_it():
    # Two local steps a batch: the host's count would follow one.
    x, y = data()
    model = compiled(False)
    keras_step = model.train_step

    def twice(state, data):
        _, state = keras_step(state, data)
        return keras_step(state, data)

    model.train_step = twice
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)
    assert not isinstance(model.train_function, ProgramsByPeriodEnd)
    assert int(model.optimizer.local_step.numpy()) == 2 * BATCHES
    assert int(model.optimizer.communication_rounds.numpy()) == 2 * BATCHES // 4


def test_steps_ending_refuses_what_is_not_a_tuple_of_fragments():
    optimizer = AGNOptimizer(keras.optimizers.SGD(0.1), 4, fragments=2)
    for wrong in ([0], (2,), (True,), 0):
        with pytest.raises(TypeError, match="tuple of fragment indices"):
            with optimizer.trainer_seams.steps_ending(wrong):
                pass
    with pytest.raises(ValueError, match="every step ends the period"):
        with AGNOptimizer(
            keras.optimizers.SGD(0.1), 1
        ).trainer_seams.steps_ending(()):
            pass


ONE_OF_ONE = """
import numpy as np, keras
from keras_clones import AGNOptimizer
from keras_clones.jax_trainer import period_programs
reads = []
class Counting(period_programs.LocalStepCount):
    def __init__(self, optimizer, read):
        super().__init__(optimizer, lambda a: reads.append(1) or read(a))
period_programs.LocalStepCount = Counting
x = np.random.default_rng(0).normal(size=(40, 5)).astype("float32")
model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
model.compile(AGNOptimizer(keras.optimizers.SGD(0.1), 4), "mse")
model.fit(x, x[:, :2], batch_size=4, epochs=2, verbose=0)
print(len(reads), sorted(model.train_function.step_programs))
"""


def test_a_process_started_as_one_of_one_reads_the_local_step_once_a_fit():
    # Its state is wrapped again for every execution: the count reads the
    # state as Keras hands it back, the very arrays the last one returned.
    env = dict(os.environ, KERAS_DISTRIBUTION_NUM_PROCESSES="1")
    env.pop("XLA_FLAGS")  # One device: one worker a process.
    done = subprocess.run(
        [sys.executable, "-c", ONE_OF_ONE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "1 [('step', ()), ('step', (0,))]"
