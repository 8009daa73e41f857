"""One step in flight at a time where several CPU devices share a
program.

XLA's CPU client runs each device's part of a program on a thread pool,
in no set order across programs, each part taking one of its device's
slots for programs in flight. Keras's `fit`, `evaluate` and `predict` do
not wait between steps, so with many in flight a device's part of one
step can wait for a slot that later steps hold while its peer waits for
it in the step's collective: a deadlock. Measured before this: 2 runs in
28 of `examples/jax_processes.py --model-parallel` (2 CPU devices a
worker) hung in `evaluate`, and `bench/clones.py --jax` ended twice in
XLA's rendezvous timeout during `fit` on 2 host devices (once in Keras's
own `DataParallel`). GPUs keep Keras's pace.
"""

import functools

import jax


def on_several_cpu_devices(devices):
    """Whether a program over `devices` is one that may deadlock."""
    devices = list(devices)
    return len(devices) > 1 and devices[0].platform == "cpu"


def one_at_a_time(function):
    """Keras's train, test or predict `function`, waiting for each call's
    results before it returns (once, however often wrapped)."""
    if function is None or getattr(function, "one_at_a_time", False):
        return function

    @functools.wraps(function)
    def one_step_in_flight(*args):
        return jax.block_until_ready(function(*args))

    one_step_in_flight.one_at_a_time = True
    return one_step_in_flight
