"""AGN's trajectories, for a refactor that must not change a bit.

    KERAS_BACKEND=tensorflow python tests/trajectories.py save before.npz
    ... change the code ...
    KERAS_BACKEND=tensorflow python tests/trajectories.py save after.npz
    python tests/trajectories.py compare before.npz after.npz

`save` fits each recipe below for 23 steps in one process on the backend
of `KERAS_BACKEND` (a plain `keras.Model`, one step per call), and keeps
the model's and the optimizer's variables after every step. `compare`
says, per recipe, whether two files are bit-identical, or the largest
difference and where it first appears. Two saves of the same code on the
same machine are bit-identical (`compare` of a file with a second save is
the check of that). The recipes are issue 51's: plain AGN, DiLoCo,
`fragments=2`, overlap, bfloat16 commits, Adam with the gradients rule,
int8 and int4 commits (int4 with error feedback), and a skipped non-finite
step; then the skipped step with fragments and
with delayed Nesterov (outer optimizers on values, their moves judged).
"""

import os
import sys

import numpy as np

STEPS, BATCH, PERIOD = 23, 4, 4
NAN_STEP = 9  # The recipe "nan_skip" has a NaN in this step's batch.


def recipes(keras, AGNOptimizer):
    """Per name, a function that makes its optimizer."""
    sgd = keras.optimizers.SGD

    def diloco(inner, **options):
        return lambda: AGNOptimizer(
            inner(1e-2),
            PERIOD,
            commit="weight_change",
            normalize=False,
            outer_optimizer=sgd(0.7, momentum=0.9, nesterov=True),
            **options,
        )

    def fragments():
        return AGNOptimizer(
            sgd(0.05), PERIOD, outer_optimizer=sgd(0.5), fragments=2
        )

    return {
        "plain": lambda: AGNOptimizer(sgd(0.05, momentum=0.9), PERIOD),
        "diloco": diloco(keras.optimizers.AdamW),
        "fragments_2": fragments,
        "overlap": lambda: AGNOptimizer(
            sgd(0.05), PERIOD, commit="weight_change", overlap=True
        ),
        "bfloat16": lambda: AGNOptimizer(
            sgd(0.05), PERIOD, communication_dtype="bfloat16"
        ),
        "adam_gradients": lambda: AGNOptimizer(
            keras.optimizers.Adam(1e-2), PERIOD
        ),
        "int8": lambda: AGNOptimizer(
            sgd(0.05, momentum=0.9), PERIOD, communication_dtype="int8"
        ),
        "int4_diloco": diloco(
            keras.optimizers.Adam, communication_dtype="int4"
        ),
        "nan_skip": lambda: AGNOptimizer(sgd(0.05, momentum=0.9), PERIOD),
        # The outers on values, their moves judged by a guard.
        "fragments_nan_skip": fragments,
        "delayed_nesterov_nan_skip": diloco(
            keras.optimizers.Adam, delayed_nesterov=2
        ),
    }


def data(nan):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 2))).astype("float32")
    if nan:
        x[NAN_STEP * BATCH, 0] = np.nan
    return x, y


def trajectory(keras, callbacks, name, make_optimizer):
    """The variables after each of the recipe's steps: name -> array of
    (STEPS, *shape)."""
    keras.backend.clear_session()  # The same variable paths every time.
    keras.utils.set_random_seed(1)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
    model.compile(make_optimizer(), "mse")
    steps = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if hasattr(model, "jax_state_sync"):  # JAX holds them apart.
                model.jax_state_sync()
            variables = model.weights + model.optimizer.variables
            to_numpy = keras.ops.convert_to_numpy
            steps.append({v.path: to_numpy(v) for v in variables})

    guarded = name.endswith("nan_skip")
    checks = [callbacks.InfNanCheck("skip")] if guarded else []
    model.fit(
        *data(guarded),
        batch_size=BATCH,
        shuffle=False,
        verbose=0,
        callbacks=[*checks, Record()],
    )
    return {path: np.stack([s[path] for s in steps]) for path in steps[0]}


def save(path):
    import keras

    from keras_clones import AGNOptimizer
    from keras_clones import callbacks

    arrays = {}
    for name, make in recipes(keras, AGNOptimizer).items():
        for key, value in trajectory(keras, callbacks, name, make).items():
            arrays[f"{name}|{key}"] = value
    np.savez(path, **arrays)
    print(f"{keras.backend.backend()}: {len(arrays)} arrays to {path}.")


def compare(a_path, b_path):
    """Prints each recipe's verdict; True if all are bit-identical."""
    a, b = np.load(a_path), np.load(b_path)
    if sorted(a.files) != sorted(b.files):
        print("The files hold different variables:")
        print(" only in the first:", sorted(set(a.files) - set(b.files)))
        print(" only in the second:", sorted(set(b.files) - set(a.files)))
        return False
    identical = True
    for name in sorted({key.split("|")[0] for key in a.files}):
        worst, first = 0.0, None
        for key in (k for k in a.files if k.startswith(name + "|")):
            x, y = a[key].astype("float64"), b[key].astype("float64")
            same = (x == y) | (np.isnan(x) & np.isnan(y))
            if same.all():
                continue
            step = int(np.argwhere(~same)[0][0]) + 1
            worst = max(worst, float(np.nanmax(np.abs(x - y))))
            if first is None or step < first[0]:
                first = (step, key.split("|")[1])
        if first is None:
            print(f"{name}: bit-identical")
        else:
            identical = False
            print(
                f"{name}: differs by up to {worst:.3g}, first at step "
                f"{first[0]} in {first[1]}"
            )
    return identical


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if sys.argv[1:2] == ["save"] and len(sys.argv) == 3:
        save(sys.argv[2])
    elif sys.argv[1:2] == ["compare"] and len(sys.argv) == 4:
        sys.exit(0 if compare(sys.argv[2], sys.argv[3]) else 1)
    else:
        sys.exit(__doc__)
