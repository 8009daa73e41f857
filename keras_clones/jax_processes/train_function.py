"""The train function of a model whose AGN steps run across JAX processes:
Keras's own `train_step`, traced once inside `jax.shard_map` over the
workers' mesh, and the program that makes each execution's logs global.

Each execution wraps the state Keras hands it as this process's part of
global arrays (unless it is the last execution's, still wrapped), runs
`steps_per_execution` steps on them (each on this process's own batch; in
one program, a `lax.scan` of the steps, where the batches are alike), and
makes the logs global. Keras keeps the wrapped state between
executions; where it writes the state back into the variables
(`jax_state_sync`, at an epoch's end or for a callback), it is unwrapped:
the variables, callbacks, `evaluate` and `save` stay this process's own.
The step program holds no collective outside the AGN period end's
conditional: steps that end no period communicate nothing; each
execution all-reduces its logs once, in a program of its own.
"""

import weakref

import jax
import keras
import numpy as np
from jax.sharding import PartitionSpec

from keras_clones import process_axis


def make(model, workers):
    """`model`'s train function across `workers` (a `Workers`), as Keras's
    JAX trainer calls it: `(state, iterator) -> (logs, state)`."""

    step = workers.program(
        model.train_step,
        lambda specs: (PartitionSpec(), specs[0]),
        donate=(0,),
    )

    def steps(state, batches):
        def one(state, batch):
            logs, state = model.train_step(state, batch)
            return state, logs

        state, logs = jax.lax.scan(one, state, batches)
        return jax.tree.map(lambda log: log[-1], logs), state

    # An execution's steps in one program, where its batches are alike.
    scanned = workers.program(
        steps, lambda specs: (PartitionSpec(), specs[0]), donate=(0,)
    )
    logs_program = global_logs_program(model, workers)

    def train_function(state, iterator):
        batches = [next(iterator)]  # Ends the epoch, as in Keras, if none.
        for _ in range(model.steps_per_execution - 1):
            try:
                batches.append(next(iterator))
            except StopIteration:
                break
        state = jax.tree.map(workers.wrapped, state)
        if len(batches) > 1 and _alike(batches):
            stacked = jax.tree.map(lambda *b: jax.numpy.stack(b), *batches)
            logs, state = scanned(state, workers.wrap_data(stacked))
        else:
            for batch in batches:
                logs, state = step(state, workers.wrap_data(batch))
        logs = jax.tree.map(workers.unwrap, logs_program(state[3], logs))
        return logs, state  # Global: `fitting.jax_state_sync` unwraps it.

    # Its compiled programs of steps, to read.
    train_function.step_programs = (step, scanned)
    return train_function


def _alike(batches):
    """Whether `batches` have the same structure and shapes."""
    first = jax.tree.map(np.shape, batches[0])
    return all(jax.tree.map(np.shape, b) == first for b in batches[1:])


def global_logs_program(model, workers):
    """The program that makes logs global: given a model's metrics'
    state and its logs (a dict of scalars), each metric's result from its
    state summed over the processes, as across TensorFlow workers, and any
    other log, its mean over them. One flat all-reduce per dtype."""
    variables = model.metrics_variables
    of = weakref.ref(model)  # A model's cache of these may hold it.

    def make_global(metrics_values, logs):
        summed = process_axis.total(metrics_values)
        with keras.StatelessScope(state_mapping=list(zip(variables, summed))):
            results = of().get_metrics_result()
        others = [k for k in logs if k not in results]
        means = dict(zip(others, process_axis.mean([logs[k] for k in others])))
        return {k: results[k] if k in results else means[k] for k in logs}

    return workers.program(make_global, lambda specs: PartitionSpec())
