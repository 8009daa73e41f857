"""AGN variants trained across JAX processes, as a user's script trains:
`keras.distribution.initialize()`, a plain `keras.Model`, each process
fitting its own rows. tests_jax/test_agn_across_processes.py launches it
on 2 processes and checks each against AGN by hand (tests/reference).

`agn_variants.py OUT NAME...`: each variant NAME of `variants.VARIANTS`
(or "bn_uneven") at each of its `steps_per_execution` K
(`variants.executions`; `NAME@K` at K alone), the Ks in turn; each
process writes `OUT/NAME.K.PROCESS.npz`.
"""

import json
import sys

import keras

keras.distribution.initialize()  # Before any other Keras object.

import jax  # noqa: E402
import numpy as np  # noqa: E402
import variants  # noqa: E402

from keras_clones.callbacks import InfNanCheck  # noqa: E402


class WeightsAtStart(keras.callbacks.Callback):
    """The weights at the start, and the train function `fit` ran (which
    `InfNanCheck` replaces when it leaves)."""

    def on_train_begin(self, logs=None):
        self.weights = self.model.get_weights()

    def on_epoch_end(self, epoch, logs=None):
        self.train_function = self.model.train_function


def main():
    out, names = sys.argv[1], sys.argv[2:]
    for steps_per_execution in (1, 3):
        for given in names:
            name, _, only = given.partition("@")
            at = (int(only),) if only else variants.executions(name)
            if steps_per_execution in at:
                run(out, name, steps_per_execution)


def run(out, name, steps_per_execution):
    if name == "bn_uneven":
        return run_batch_norm(out, steps_per_execution)
    if name == "model_parallel_refused":
        return run_refused(out)
    process = jax.process_index()
    options, inner, _, outer, _ = variants.VARIANTS[name]
    x, y = variants.data(process, nan="nan" in name)
    if "model_parallel" in name:
        keras.distribution.set_distribution(variants.model_parallel())
    # Different on each process.
    model = variants.mlp(
        seed=process, lazy="lazy" in name, clones=variants.CLONES.get(name, 0)
    )
    model.compile(
        keras_clones_agn(inner, outer, options),
        "mse",
        steps_per_execution=steps_per_execution,
    )
    start = WeightsAtStart()
    callbacks = [start] + ([InfNanCheck("skip")] if "nan" in name else [])
    history = model.fit(
        x,
        y,
        batch_size=variants.BATCH,
        epochs=variants.EPOCHS,
        shuffle=False,
        callbacks=callbacks,
        verbose=0,
    )
    optimizer = model.optimizer
    centers = [
        optimizer.global_center_variable(v) for v in model.trainable_variables
    ]
    np.savez(
        f"{out}/{name}.{steps_per_execution}.{process}.npz",
        start=variants.flat(start.weights),
        local=variants.flat(model.get_weights()),
        center=variants.flat([np.asarray(c) for c in centers]),
        loss=history.history["loss"],
        skipped=history.history.get("skipped_steps", []),
        clone_losses=[history.history[f"clone_{i}_loss"] for i in range(2)]
        if "clone_1_loss" in history.history
        else [],
        rounds=int(optimizer.communication_rounds.numpy()),
        iterations=int(optimizer.iterations.numpy()),
        trainable=[v.path for v in model.trainable_variables],
        # Each variable's: path, layout, the share a device holds.
        layouts=[
            (v.path, str(getattr(v.value.sharding, "spec", "")), shard_share(v))
            for v in [*model.weights, *optimizer.variables]
        ],
    )
    keras.distribution.set_distribution(None)
    if process == 0:  # Each program of steps: (kind, periods ended): text.
        programs = start.train_function.step_programs
        texts = {
            repr(key): text
            for key, program in programs.items()
            for text in program.compiled_texts()
        }
        with open(f"{out}/{name}.steps.{steps_per_execution}.json", "w") as f:
            json.dump(texts, f)
    print(f"variant {name} at {steps_per_execution} done", flush=True)


def run_refused(out):
    """`fit` under `variants.model_parallel()` over a worker of several
    processes: the error each process raises, to OUT/refused.PROCESS.json."""
    process = jax.process_index()
    x, y = variants.data(process)
    options, inner, _, outer, _ = variants.VARIANTS["diloco"]
    model = variants.mlp(seed=0)  # Outside: a mesh spans the processes.
    model.compile(keras_clones_agn(inner, outer, options), "mse")
    keras.distribution.set_distribution(variants.model_parallel())
    try:
        model.fit(x, y, batch_size=variants.BATCH, verbose=0)
        raised = None
    except ValueError as error:
        raised = str(error)
    finally:
        keras.distribution.set_distribution(None)
    with open(f"{out}/refused.{process}.json", "w") as f:
        json.dump(raised, f)
    print("variant model_parallel_refused done", flush=True)


def shard_share(variable):
    """The share of `variable` its first device holds."""
    value = variable.value
    return value.addressable_shards[0].data.size / max(value.size, 1)


def run_batch_norm(out, steps_per_execution):
    """`variants.batch_norm_model` on batches of 7 rows, with a period no
    step ends: each process's start and end weights (all of them)."""
    import warnings

    from keras_clones import AGNOptimizer

    process = jax.process_index()
    x, y = variants.data(process)
    model = variants.batch_norm_model(seed=process)
    model.compile(
        AGNOptimizer(keras.optimizers.SGD(0.1), 1000),
        "mse",
        steps_per_execution=steps_per_execution,
    )
    start = WeightsAtStart()  # Process 0's, on every process.
    with warnings.catch_warnings():  # Its steps are not committed: known.
        warnings.simplefilter("ignore")
        model.fit(
            x,
            y,
            batch_size=variants.BN_ROWS,
            shuffle=False,
            verbose=0,
            callbacks=[start],
        )
    np.savez(
        f"{out}/bn_uneven.{steps_per_execution}.{process}.npz",
        *start.weights,
        *model.get_weights(),
    )
    print(f"variant bn_uneven at {steps_per_execution} done", flush=True)


def keras_clones_agn(inner, outer, options):
    from keras_clones import AGNOptimizer

    return AGNOptimizer(
        inner(),
        variants.PERIOD,
        outer_optimizer=outer and outer(),
        **options,
    )


if __name__ == "__main__":
    main()
