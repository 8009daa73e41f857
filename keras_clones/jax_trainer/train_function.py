"""The train function of a model whose AGN steps run across JAX processes:
Keras's own `train_step`, traced once inside `jax.shard_map` over the
workers' mesh (on a worker of several devices, its batch split over them:
one device's step on the worker's batch), and the program that makes each
execution's logs global.

Each execution wraps the state Keras hands it as this process's part of
global arrays (unless it is the last execution's, still wrapped), runs
`steps_per_execution` steps on them (each on this process's own batch; in
one program, a `lax.scan` of the steps, where the batches are alike), and
makes the logs global. Keras keeps the wrapped state between
executions; where it writes the state back into the variables
(`jax_state_sync`, at an epoch's end or for a callback), it is unwrapped:
the variables, callbacks, `evaluate` and `save` stay this process's own.

As in one process (`keras_clones.jax_trainer.period_programs`), the host
counts the local step and each program is traced for the periods its
steps end: a step's, or an execution's where only its last step may end
one (as where
`steps_per_execution` divides the period over the fragments); an
execution that ends a period before its last step asks in each step (a
conditional). Steps that end no period communicate nothing; a period's
end all-reduces its commit in the program of its step; each execution
all-reduces its logs once, in a program of its own.
"""

import weakref

import jax
import keras
import numpy as np
from jax.sharding import PartitionSpec

from keras_clones.jax_trainer import period_programs
from keras_clones.replicas import worker_axis


def make(model, workers):
    """`model`'s train function across `workers` (a `Workers`), as Keras's
    JAX trainer calls it: `(state, iterator) -> (logs, state)`."""
    optimizer = period_programs.counted_optimizer(model)
    count = None
    if optimizer is not None:
        count = period_programs.LocalStepCount(
            optimizer, read=lambda a: int(workers.unwrap(a))
        )
    specs = lambda specs: (PartitionSpec(), specs[0])  # noqa: E731
    programs = {}  # Each program made, by what its steps end.

    def traced(ending):
        return period_programs.traced_for(optimizer, ending)

    def step_program(ending):
        """One step, which ends the periods of `ending` (None: it asks)."""

        def step(state, batch):
            with traced(ending):
                return model.train_step(state, workers.shard_rows(batch))

        return workers.program(step, specs, donate=(0,), keeps_layout=True)

    def scanned_program(ending):
        """An execution's steps in one program (a `lax.scan`), its last
        ending the periods of `ending` and the others none; None: each step
        asks."""

        def one(state, batch):
            logs, state = model.train_step(state, workers.shard_rows(batch))
            return state, logs

        def steps(state, batches):
            if ending is not None:
                batches, last = _split_last(batches)
            with traced(None if ending is None else ()):
                state, logs = jax.lax.scan(one, state, batches)
            logs = jax.tree.map(lambda log: log[-1], logs)
            if ending is not None:
                with traced(ending):
                    last = workers.shard_rows(last)
                    logs, state = model.train_step(state, last)
            return logs, state

        return workers.program(steps, specs, donate=(0,), keeps_layout=True)

    def program(kind, ending):
        made = programs.get((kind, ending))
        if made is None:
            make_program = step_program if kind == "step" else scanned_program
            made = programs[kind, ending] = make_program(ending)
        return made

    logs_program = global_logs_program(model, workers)

    def train_function(state, iterator):
        batches = [next(iterator)]  # Ends the epoch, as in Keras, if none.
        for _ in range(model.steps_per_execution - 1):
            try:
                batches.append(next(iterator))
            except StopIteration:
                break
        endings = [None] * len(batches)
        if count is not None:  # On the state as Keras hands it back.
            endings = count.endings(state, len(batches))
        state = jax.tree.map(workers.wrapped, state)
        if len(batches) > 1 and _alike(batches):
            # Known where every step but the last ends no period.
            known = count is not None and not any(endings[:-1])
            stacked = jax.tree.map(lambda *b: jax.numpy.stack(b), *batches)
            scanned = program("scanned", endings[-1] if known else None)
            logs, state = scanned(state, workers.wrap_data(stacked, axis=1))
        else:
            for batch, ending in zip(batches, endings):
                stepped = program("step", ending)
                logs, state = stepped(state, workers.wrap_data(batch))
        if count is not None:
            count.returned(state)
        logs = jax.tree.map(workers.unwrap, logs_program(state[3], logs))
        return logs, state  # Global: `fitting.jax_state_sync` unwraps it.

    # Its compiled programs of steps, to read: by ("step" or "scanned",
    # the periods ended, or None where the steps ask).
    train_function.step_programs = programs
    return train_function


def _split_last(batches):
    """A stack of batches as the stack of all but the last, and the last."""
    return (
        jax.tree.map(lambda b: b[:-1], batches),
        jax.tree.map(lambda b: b[-1], batches),
    )


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
        summed = worker_axis.total(metrics_values)
        with keras.StatelessScope(state_mapping=list(zip(variables, summed))):
            results = of().get_metrics_result()
        others = [k for k in logs if k not in results]
        means = dict(zip(others, worker_axis.mean([logs[k] for k in others])))
        return {k: results[k] if k in results else means[k] for k in logs}

    return workers.program(make_global, lambda specs: PartitionSpec())
