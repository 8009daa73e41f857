"""Module changes while one multi-worker training step is traced.

How often control moves from one keras_clones module to another while
TensorFlow traces the step of a 2-worker CloneModel(2 clones) with AGN,
InfNanCheck and LossSummaries: how scattered a step's code is, whatever the
machine. What and how: docs/benchmarks/throughput.md#module_changes.

    python bench/module_changes.py [--verbose] [--timeout SECONDS]
"""

import json
import os
import sys
import tempfile
import threading

import harness
import launching

PACKAGE = "keras_clones"
CALLBACKS = f"{PACKAGE}.callbacks"
WORKERS = 2
GLOBAL_BATCH = 16
ROWS = 64
PERIOD = 10
# AutoGraph's converted copies of functions: their files, and the function
# in them that builds a copy before its first call.
AUTOGRAPH_FILE = "__autograph_generated_file"
AUTOGRAPH_FACTORY = "inner_factory"
FLAGS = [
    harness.Flag("--verbose", False, help="also the sequence of changes"),
    harness.Flag("--timeout", 300, help="seconds before the launch is stopped"),
]


def package_module(frame):
    """The keras_clones module `frame` runs in, or None (for AutoGraph's
    factory of a converted function too: TensorFlow's code, run with the
    module's globals)."""
    code = frame.f_code
    if code.co_name == AUTOGRAPH_FACTORY and AUTOGRAPH_FILE in code.co_filename:
        return None
    name = frame.f_globals.get("__name__") or ""
    if name == PACKAGE or name.startswith(PACKAGE + "."):
        return name
    return None


def in_callbacks(module):
    return module is not None and (module + ".").startswith(CALLBACKS + ".")


class ModuleChanges:
    """A profile hook (`sys.setprofile`, `threading.setprofile`): the
    keras_clones modules that control passes through, as the innermost
    keras_clones frame changes.

    Each thread keeps a stack of its innermost keras_clones frame per
    depth. A call counts its module; a return, the module of the innermost
    keras_clones frame left in its thread, once that thread runs
    keras_clones code again (not if another thread does first: see
    docs/benchmarks/throughput.md#module_changes). `finish` counts the
    last return.
    """

    def __init__(self):
        self._stacks = {}  # Per thread: (module, function) per depth.
        self._pending = None  # (thread, entry) of a return not yet counted.
        # (module, function, "call" or "return") at each change.
        self.sequence = []

    def __call__(self, frame, event, arg):
        if event not in ("call", "return"):  # c_call, c_return, ...
            return
        thread = threading.get_ident()
        stack = self._stacks.setdefault(thread, [None])
        module = package_module(frame)
        if event == "call":
            stack.append(
                stack[-1] if module is None else (module, frame.f_code.co_name)
            )
        elif len(stack) > 1:
            stack.pop()
        if module is None:
            return
        if self._pending is not None:
            pending_thread, entry = self._pending
            self._pending = None
            if pending_thread == thread:
                self._record(entry)
        if event == "call":
            self._record((*stack[-1], event))
        elif stack[-1] is not None:
            self._pending = (thread, (*stack[-1], event))

    def finish(self):
        if self._pending is not None:
            self._record(self._pending[1])
            self._pending = None

    def _record(self, entry):
        if not self.sequence or self.sequence[-1][0] != entry[0]:
            self.sequence.append(entry)

    def counts(self):
        modules = [module for module, _, _ in self.sequence]
        events = [event for _, _, event in self.sequence]
        entries = sum(
            1
            for before, after, event in zip([None, *modules], modules, events)
            if event == "call"
            and in_callbacks(after)
            and not in_callbacks(before)
        )
        calls = {
            (*before[:2], *after[:2])
            for before, after in zip(self.sequence, self.sequence[1:])
            if after[2] == "call"
        }
        return {
            "module_changes": max(len(modules) - 1, 0),
            "distinct_calls": len(calls),
            "distinct_changes": len(set(zip(modules, modules[1:]))),
            "distinct_modules": sorted(set(modules)),
            "callbacks_entries": entries,
            "sequence": self.sequence,
        }


def worker(argv):
    """One process of the launch: one profiled step; the chief prints the
    counts."""
    # TensorFlow's runtime starts with the strategy: split the CPU first.
    os.environ["KERAS_BACKEND"] = "tensorflow"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * 2,
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    import keras
    import numpy as np

    import keras_clones

    class ProfileFirstCall(keras.callbacks.Callback):
        """Records the module changes of the first train function call:
        wraps `train_function` once the keras_clones callbacks have put
        their hooks into the step (at `on_train_begin`)."""

        changes = None

        def on_train_batch_begin(self, batch, logs=None):
            if self.changes is not None:
                return
            self.changes = ModuleChanges()
            function = self.model.train_function

            def profiled(iterator):
                # This thread's, and those that start meanwhile.
                threading.setprofile(self.changes)
                sys.setprofile(self.changes)
                try:
                    return function(iterator)
                finally:
                    sys.setprofile(None)
                    threading.setprofile(None)
                    self.changes.finish()
                    self.model.train_function = function

            self.model.train_function = profiled

    keras.utils.set_random_seed(7)
    with strategy.scope():
        inputs = keras.Input((5,))
        h = keras.layers.Dense(8, activation="tanh")(inputs)
        h = keras.layers.BatchNormalization()(h)
        model = keras_clones.CloneModel(
            inputs,
            keras.layers.Dense(1)(h),
            deployment=keras_clones.DeploymentConfig(
                devices=["/cpu:0", "/cpu:1"]
            ),
        )
        model.compile(
            keras_clones.AGNOptimizer(keras.optimizers.Adam(), PERIOD), "mse"
        )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 5)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) ** 2).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    profile = ProfileFirstCall()
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as log_dir:
        callbacks = [
            keras_clones.callbacks.InfNanCheck(),
            keras_clones.callbacks.LossSummaries(log_dir),
            profile,
        ]
        model.fit(dataset, steps_per_epoch=1, verbose=0, callbacks=callbacks)
    if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
        print(launching.RESULT + json.dumps(profile.changes.counts()))


def measure(args):
    """The chief's counts from a 2-worker launch, or None."""
    arguments = [os.path.abspath(__file__), harness.WORKER_FLAG]
    return launching.chief_result(
        WORKERS, arguments, args.timeout, "the 2-worker launch"
    )


def report(result, args):
    modules = result["distinct_modules"]
    print(
        "One step of a 2-worker CloneModel(2 clones) with "
        f"AGNOptimizer(Adam, {PERIOD}), InfNanCheck and LossSummaries, "
        f"traced (worker 0):\nmodule changes: {result['module_changes']}\n"
        "distinct calls into another module (by the function left and the "
        "function entered; loops and clones once): "
        f"{result['distinct_calls']}\ndistinct modules: {len(modules)}: "
        f"{', '.join(modules)}\nentries into {CALLBACKS}: "
        f"{result['callbacks_entries']}\ndistinct changes (pairs of "
        f"modules, from and to): {result['distinct_changes']}"
    )
    if args.verbose:
        print(
            "\nsequence (-> a call enters the function, <- a return "
            "comes back to it):"
        )
        for i, (module, function, event) in enumerate(result["sequence"]):
            arrow = "->" if event == "call" else "<-"
            print(f"{i:4d} {arrow} {module}: {function}")


BENCHMARK = harness.Benchmark(
    __doc__, measure, report, flags=FLAGS, worker=worker
)

if __name__ == "__main__":
    harness.run(BENCHMARK)
