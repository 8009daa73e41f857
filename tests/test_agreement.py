"""What the workers compare before they train
(`keras_clones.multi_worker.description`), without a backend of its own:
the workers as threads whose gather meets at a barrier, and what it
describes of a model. The launches that refuse workers that disagree are
in test_multi_worker.py (TensorFlow) and
tests_jax/test_agn_across_processes.py (JAX)."""

import re
import threading

import keras
import numpy as np
from helpers import LazyMLP

from keras_clones import AGNOptimizer
from keras_clones.multi_worker import description


def checked_as_threads(descriptions):
    """`description.check_same` on one thread per description, whose
    gather meets at a barrier: each worker's error (None: none) and the
    lengths of the lists it gathered last."""
    count = len(descriptions)
    barrier, slots = threading.Barrier(count), [None] * count
    raised = [None] * count

    def gather(index, values):
        slots[index] = list(values)
        barrier.wait()
        gathered = list(slots)
        barrier.wait()
        return gathered

    def worker(index):
        try:
            description.check_same(
                lambda values: gather(index, values),
                "the model",
                descriptions[index],
                [f"worker {w}" for w in range(count)],
                index,
            )
        except ValueError as error:
            raised[index] = str(error)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return raised, [len(slot) for slot in slots]


def test_of_three_workers_each_names_those_that_differ_from_it():
    # 0 and 1 agree, 2 has another activation. Each raises alike, naming
    # its own value and the workers whose description differs from its
    # own, after a gather of one fingerprint and one of the buckets.
    def described(activation="tanh"):
        return {"model": {"layers": [{"units": 4, "activation": activation}]}}

    raised, gathered = checked_as_threads(
        [described(), described(), described("relu")]
    )
    field = "model.layers[0].activation"
    for index, others, value in (
        (0, "worker 2", '"tanh"'),
        (1, "worker 2", '"tanh"'),
        (2, "worker 0, worker 1", '"relu"'),
    ):
        assert raised[index] == (
            "The workers do not agree on the model; every worker must run "
            "the same script with the same configuration. Worker "
            f"{index} (this worker) differs from {others} in: {field} "
            f"(here: {value})."
        )
    assert gathered == [4096] * 3
    # Alike: no error, and no gather after the fingerprints'.
    raised, gathered = checked_as_threads([described()] * 3)
    assert raised == [None] * 3 and gathered == [1] * 3


class SquaredError:
    """A loss Keras cannot serialize (it has no `get_config`)."""

    def __call__(self, y_true, y_pred):
        return keras.ops.mean((y_true - y_pred) ** 2)


def test_a_loss_keras_cannot_serialize_agrees_whatever_its_address():
    # Compared by its repr without the memory address, which differs
    # between processes: equal objects agree, other classes do not.
    raised, _ = checked_as_threads(
        [{"loss": SquaredError()}, {"loss": SquaredError()}]
    )
    assert raised == [None, None]
    raised, _ = checked_as_threads([{"loss": SquaredError()}, {"loss": 1}])
    assert re.search(
        r'in: loss \(here: "<[\w.]*SquaredError object>"\)', raised[0]
    )
    assert raised[1].endswith("in: loss (here: 1).")


def test_an_unbuilt_subclassed_model_is_described_by_its_layers():
    # Keras's config of a subclassed model holds no layers, and before
    # `fit` builds it there are no variables: its layers' configs tell a
    # width apart before any collective. With a loss Keras cannot
    # serialize, the optimizer's configuration is still described.
    model = LazyMLP()
    model.compile(AGNOptimizer(keras.optimizers.Adam(0.01), 4), SquaredError())
    described = description.describe(model)
    assert described["weights"] == []
    layers = described["model"]["layers"]
    assert [layer["class"] for layer in layers] == ["Dense", "Dense"]
    assert [layer["config"]["units"] for layer in layers] == [4, 2]
    assert layers[0]["config"]["activation"] == "tanh"
    assert described["model"]["class"] == "LazyMLP"
    optimizer = described["compile"]["optimizer"]
    assert optimizer["class"] == "AGNOptimizer"
    assert optimizer["config"]["communication_period"] == 4
    inner = optimizer["config"]["optimizer"]["config"]
    assert np.float32(inner["learning_rate"]) == np.float32(0.01)
