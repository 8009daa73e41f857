"""Module changes while one multi-worker training step is traced.

What it measures: how often control moves from one keras_clones module to
another while TensorFlow traces the train function of a `CloneModel` (2
clones per worker, on `/cpu:0` and `/cpu:1`) compiled with
`AGNOptimizer(Adam(), 10)` and trained by `fit` with
`keras_clones.callbacks.InfNanCheck()` and
`keras_clones.callbacks.LossSummaries(log_dir)`, under
`tf.distribute.MultiWorkerMirroredStrategy` with 2 workers: a measure of
how scattered the code of a step is, independent of the machine. It prints
the number of module changes, the distinct modules touched, how many times
a call enters `keras_clones/callbacks/` and the distinct changes (pairs of
modules, from and to), and the distinct calls into another module (a
call from function f of one module into function g of another, counted
once however often it runs: a reader's hops through the step); with
`--verbose`, the sequence of changes, each with
the function entered or returned to. The count is dynamic: a Python loop
over the model's 6 trainable variables that calls into another module
counts 2 changes per variable.

The model is that of tests/workers/common.py with BatchNormalization
(5 features, Dense(8, tanh), BatchNormalization, Dense(1), mean squared
error), so that the step also moves state; the data 64 rows in global
batches of 16, one step per execution (Keras's default).

How: the script runs itself as the 2 workers of a `keras_clones.launch` on
127.0.0.1 (`--worker`), stopped after `--timeout` seconds; each worker
splits its CPU into 2 logical devices before TensorFlow starts, makes the
strategy, and calls `fit` for one step. A last callback wraps
`model.train_function` at `on_train_batch_begin` (after the keras_clones
callbacks have put their hooks into the step at `on_train_begin`), so that
a profile hook (`sys.setprofile`, and `threading.setprofile` for the
threads `strategy.run` starts for the replica function) records the call
and return events of its first call only: the trace of the step (the graph
then runs in C++, without Python frames). Only public API: `fit`,
callbacks, `Model.train_function`. Both workers trace the same step; the
chief (worker 0) prints the counts.

Counting: a frame is in a keras_clones module when its globals' `__name__`
is `keras_clones` or starts with `keras_clones.` (a file under
keras_clones/; by the globals, not the file name, because AutoGraph runs
converted copies of the functions from temporary files, with the original
module's globals; AutoGraph's `inner_factory`, which makes such a copy
before each converted call, is TensorFlow's code and counts as not in
keras_clones). Frames of other packages (TensorFlow, Keras) are collapsed
into the keras_clones frame below them. Each thread keeps a stack of its
innermost keras_clones frame; at the call of a keras_clones function its
module is the current one, and at a return from one, the module of the
innermost keras_clones frame left in that thread. A change is counted each
time the current module differs from the previous one (the first module
counts none). A return counts only once its thread runs keras_clones code
again, not if another thread does first: `merge_call` runs its function in
the main thread, which then hands control back to the replica thread
inside TensorFlow's frames, without running the code it returned to. An
entry into callbacks/ is a change by a call to a module under
`keras_clones.callbacks` from one outside it (returns into callbacks/ from
the functions they called are not entries).

Usage:
    python bench/module_changes.py [--verbose] [--timeout SECONDS]
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading

import launching

PACKAGE = "keras_clones"
CALLBACKS = f"{PACKAGE}.callbacks"
WORKERS = 2
TIMEOUT = 300  # Seconds before the launch is stopped.
RESULT = "RESULT "  # What a worker's result line starts with.
GLOBAL_BATCH = 16
ROWS = 64
PERIOD = 10
# AutoGraph's converted copies of functions: their files, and the function
# in them that builds a copy before its first call.
AUTOGRAPH_FILE = "__autograph_generated_file"
AUTOGRAPH_FACTORY = "inner_factory"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also print the sequence of module changes",
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=TIMEOUT,
        help=f"seconds before the launch is stopped (default {TIMEOUT})",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


# The counting (standard library only).


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


class ModuleChanges:
    """A profile hook (`sys.setprofile`, `threading.setprofile`): the
    keras_clones modules that control passes through, as the innermost
    keras_clones frame changes.

    Each thread has its own stack of the innermost keras_clones frame at
    each depth, pushed at each call event and popped at each return event
    (generators and coroutines give one at each resumption and suspension);
    returns from frames entered before the hook was set find the stack at
    its bottom and leave it there. Only the events of keras_clones frames
    count: a call (its module), and a return (the module of the innermost
    keras_clones frame left in that thread, if any). A return counts once
    its thread runs keras_clones code again (its next keras_clones event),
    and not if another thread does first: `strategy.run` runs the replica
    function in a thread of its own, and `merge_call` runs its function in
    the calling thread, which, once it has returned, hands control back in
    TensorFlow's frames without running the code it returned to. `finish`
    counts the last return.
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
        """Counts the last return (the trace ends in the code it returned
        to)."""
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
        pairs = set(zip(modules, modules[1:]))
        calls = {
            (*before[:2], *after[:2])
            for before, after in zip(self.sequence, self.sequence[1:])
            if after[2] == "call"
        }
        return {
            "module_changes": max(len(modules) - 1, 0),
            "distinct_calls": len(calls),
            "distinct_changes": len(pairs),
            "distinct_modules": sorted(set(modules)),
            "callbacks_entries": entries,
            "sequence": self.sequence,
        }


def in_callbacks(module):
    return module is not None and (
        module == CALLBACKS or module.startswith(CALLBACKS + ".")
    )


# The worker: one process of the launch.


def worker(args):
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
        """Records the module changes of the first train function call."""

        def __init__(self):
            super().__init__()
            self.changes = None

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
    log_dir = tempfile.mkdtemp(prefix="module_changes_")
    try:
        model.fit(
            dataset,
            epochs=1,
            steps_per_epoch=1,
            verbose=0,
            callbacks=[
                keras_clones.callbacks.InfNanCheck(),
                keras_clones.callbacks.LossSummaries(log_dir),
                profile,
            ],
        )
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    if task == 0:
        print(RESULT + json.dumps(profile.changes.counts()), flush=True)


# The driver: runs the launch and prints the chief's counts.


def main():
    args = parse_args()
    if args.worker:
        worker(args)
        return
    arguments = [os.path.abspath(__file__), "--worker"]
    status, lines = launching.run_launch(WORKERS, arguments, args.timeout)
    result = launching.printed_result(lines, "[worker 0] " + RESULT)
    if status != 0 or result is None:
        launching.print_failure("the 2-worker launch", status, lines)
        sys.exit(1)
    print(
        f"One step of a 2-worker CloneModel(2 clones) with "
        f"AGNOptimizer(Adam, {PERIOD}), InfNanCheck and LossSummaries, "
        "traced (worker 0):"
    )
    print(f"module changes: {result['module_changes']}")
    print(
        "distinct calls into another module (by the function left and "
        f"the function entered; loops and clones once): "
        f"{result['distinct_calls']}"
    )
    modules = result["distinct_modules"]
    print(f"distinct modules: {len(modules)}: {', '.join(modules)}")
    print(f"entries into {CALLBACKS}: {result['callbacks_entries']}")
    print(
        "distinct changes (pairs of modules, from and to): "
        f"{result['distinct_changes']}"
    )
    if args.verbose:
        print(
            "\nsequence (-> a call enters the function, <- a return "
            "comes back to it):"
        )
        for i, (module, function, event) in enumerate(result["sequence"]):
            arrow = "->" if event == "call" else "<-"
            print(f"{i:4d} {arrow} {module}: {function}")


if __name__ == "__main__":
    main()
