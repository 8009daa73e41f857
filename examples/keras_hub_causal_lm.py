"""DiLoCo across JAX processes on a keras-hub model: a tiny GPT-2 causal
language model, built from its classes, each process a worker that trains
on its own sequences.

    KERAS_BACKEND=jax python -m keras_clones.launch --workers 2 \
        examples/keras_hub_causal_lm.py

keras-hub 0.32 declares tensorflow-text as a requirement, which pulls in
TensorFlow; its TensorFlow imports are guarded, so a JAX venv installs it
without: `pip install grain` (keras-hub's `fit` batches arrays with it
where TensorFlow is absent), then `pip install --no-deps keras-hub==0.32.0
regex tokenizers`.

The model is `keras_hub.models.GPT2CausalLM` on a `GPT2Backbone` of 2
layers, hidden size 32, a vocabulary of 64 and no dropout, its weights
random (a preset would download them), with no preprocessor: the token
ids are fed directly. The sequences are generated, the same on every
process (one seed), each process taking every N-th one from its own index
on: each counts up from a random token by a random step of 1 to 3, modulo
the vocabulary, so after two tokens every next one is predictable.

The optimizer is docs/agn.md's DiLoCo recipe (inner AdamW, outer Nesterov
SGD, the weights' change committed undivided): each process takes 8 local
steps on its own batches (`batch_size` is per process), then the
processes average their commits. Process 0 prints the training loss of
the first and the last epoch and the rounds; every process prints a
checksum of its centers (the global model), the same on each.

To save and resume such a model, which compiles itself when built, see
docs/surviving_a_crash.md#saved-models-are-not-backups.
"""

import argparse

import keras

keras.distribution.initialize()  # First: before any other Keras object.

import jax  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402

from keras_clones import AGNOptimizer  # noqa: E402

VOCABULARY = 64
LENGTH = 16


def sequences(rows=1024, seed=0):
    """Token ids that count up by a step of 1 to 3, modulo the vocabulary:
    the inputs and, one token on, the targets."""
    rng = np.random.default_rng(seed)
    start = rng.integers(0, VOCABULARY, size=(rows, 1))
    step = rng.integers(1, 4, size=(rows, 1))
    tokens = (start + step * np.arange(LENGTH + 1)) % VOCABULARY
    x = {
        "token_ids": tokens[:, :-1].astype("int32"),
        "padding_mask": np.ones((rows, LENGTH), dtype=bool),
    }
    return x, tokens[:, 1:].astype("int32")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    options = parser.parse_args()

    x, y = sequences()
    # This process's sequences (the NumPy seed is the same on every
    # process), as many on every process: its steps are compiled for its
    # batches.
    n = jax.process_count()
    mine = slice(jax.process_index(), len(y) // n * n, n)
    x = {name: ids[mine] for name, ids in x.items()}
    y = y[mine]

    keras.utils.set_random_seed(0)  # The same initial weights everywhere.
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=LENGTH,
        dropout=0.0,  # A deterministic pattern; half the compile time.
    )
    model = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    optimizer = AGNOptimizer(  # docs/agn.md's DiLoCo recipe.
        keras.optimizers.AdamW(3e-3),
        communication_period=8,
        outer_optimizer=keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True),
        commit="weight_change",
        normalize=False,
    )
    model.compile(
        optimizer,
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=8,  # The period: one commit per execution.
    )
    history = model.fit(
        x,
        y,
        batch_size=32,
        epochs=options.epochs,
        shuffle=False,  # keras-hub batches the arrays into a dataset, in order.
    )
    optimizer.assign_global_centers()  # The global model.
    losses = history.history["loss"]
    rounds = int(keras.ops.convert_to_numpy(optimizer.communication_rounds))
    if jax.process_index() == 0:
        print(f"training loss: first epoch {losses[0]:.4f}, ", end="")
        print(f"last epoch {losses[-1]:.4f}; {rounds} communication rounds")
    checksum = sum(
        np.abs(keras.ops.convert_to_numpy(w)).astype("float64").sum()
        for w in model.trainable_weights
    )
    print(f"checksum of the centers: {checksum:.10e}")


if __name__ == "__main__":
    main()
