"""AGNOptimizer(fragments=F) against the rule by hand, in one process:
each fragment of the weights commits at its own step of the period, and
the outer optimizer moves it alone, with its own state. (Across workers:
tests/test_multi_worker.py.)"""

import keras
import numpy as np
import pytest
from against_reference import run_against_reference
from helpers import INNER_LR
from helpers import RULES
from reference import optimizers

from keras_clones import AGNOptimizer
from keras_clones.agn import fragment

PERIOD, STEPS, SIZE = 4, 12, 10
# An outer Adam: each fragment's bias correction counts its own commits.
OWN = {
    "adam_outer": (
        {},
        lambda: keras.optimizers.SGD(INNER_LR),
        lambda: optimizers.SGD(INNER_LR),
        lambda: keras.optimizers.Adam(0.1),
        lambda: optimizers.Adam(0.1),
    )
}


def run_fragments(name, fragments, dtype=None, overlap=False, mixing=None):
    """The optimizer's local weights and centers after each step, then
    after the commits in flight are applied, against the hand's."""
    rng = np.random.default_rng(0)
    start = rng.normal(size=SIZE).astype("float32")
    grads = rng.normal(size=(STEPS, SIZE)).astype("float32")
    optimizer, variable, by_hand, history = run_against_reference(
        {**RULES, **OWN}[name],
        start,
        grads,
        PERIOD,
        communication_dtype=dtype,
        fragments=fragments,
        overlap=overlap,
        mixing=mixing,
    )
    # Adam's float32 steps drift from the hand's by 1e-6; a bfloat16
    # rounding by hand may land a bfloat16 ulp away.
    atol = 1e-6 if name == "contrib" else 1e-5
    tolerance = {"rtol": 1e-6, "atol": atol if dtype is None else 1e-2}

    def assert_as_by_hand(local, center, got=None):
        got_local, got_center = got or (
            variable.numpy(),
            optimizer.global_center_variable(variable).numpy(),
        )
        np.testing.assert_allclose(got_local, local, **tolerance)
        np.testing.assert_allclose(got_center, center, **tolerance)

    for got, (local, center) in zip(history, by_hand.history, strict=True):
        assert_as_by_hand(local[0], center, got)
    optimizer.apply_in_flight_commit()
    assert_as_by_hand(by_hand.local[0], by_hand.center)
    return optimizer


# The two kinds of commit (accumulated gradients: contrib; the weight
# change: DiLoCo, as Hermans's and Downpour's, which differ from it only in
# what test_agn_rules.py checks) and an outer optimizer with state.
FRAGMENTED = ["contrib", "diloco", "adam_outer"]


@pytest.mark.parametrize("name", FRAGMENTED)
@pytest.mark.parametrize("fragments", [2, 4])
@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_each_fragment_commits_at_its_step_as_by_hand(name, fragments, dtype):
    optimizer = run_fragments(name, fragments, dtype)
    # One all-reduce per fragment per period.
    rounds = int(optimizer.communication_rounds.numpy())
    assert rounds == fragments * STEPS // PERIOD


@pytest.mark.parametrize("name", FRAGMENTED)
@pytest.mark.parametrize("fragments", [2, 4])
def test_overlapped_fragments_apply_a_period_late_as_by_hand(name, fragments):
    optimizer = run_fragments(name, fragments, overlap=True, mixing=0.5)
    assert optimizer.in_flight_phase.numpy().tolist() == [0] * fragments
    rounds = int(optimizer.communication_rounds.numpy())
    assert rounds == fragments * STEPS // PERIOD


def test_fragments_cut_inside_variables_at_equal_shares():
    variables = [np.zeros((784, 256)), np.zeros(256), np.zeros((256, 10))]
    cut = fragment.cut(variables, 4)
    assert [part.size for part in cut] == [50880] * 4  # 203,520 weights.
    assert [part.pieces for part in cut] == [
        [(0, 0, 50880)],
        [(0, 50880, 101760)],
        [(0, 101760, 152640)],
        [(0, 152640, 200704), (1, 0, 256), (2, 0, 2560)],
    ]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"fragments": 3}, "divides `communication_period`"),
        ({"fragments": 0}, "divides `communication_period`"),
        ({"fragments": 2.0}, "divides `communication_period`"),
        (
            {"fragments": 2, "outer_optimizer": keras.optimizers.Lamb(0.1)},
            "Lamb looks at whole variables",
        ),
        (
            {
                "fragments": 2,
                "outer_optimizer": keras.optimizers.SGD(0.1, clipnorm=1.0),
            },
            "`clipnorm` looks at whole variables",
        ),
    ],
)
def test_invalid_fragments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AGNOptimizer(keras.optimizers.SGD(0.1), 4, **kwargs)


def test_more_fragments_than_weights_is_refused_at_build():
    optimizer = AGNOptimizer(keras.optimizers.SGD(0.1), 4, fragments=4)
    with pytest.raises(ValueError, match="more than the model's 3 weights"):
        optimizer.build([keras.Variable(np.zeros(3, "float32"))])


def test_fragments_round_trip_through_config():
    optimizer = AGNOptimizer(keras.optimizers.SGD(0.1), 4, fragments=2)
    config = optimizer.get_config()
    assert config["fragments"] == 2
    assert AGNOptimizer.from_config(config).get_config() == config


def test_fragment_state_is_saved_and_restored_with_the_model(tmp_path):
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(
        AGNOptimizer(
            keras.optimizers.Adam(0.05),
            4,
            outer_optimizer=keras.optimizers.Adam(0.1),
            fragments=2,
        ),
        "mse",
    )
    model.fit(x[:12], y[:12], batch_size=2, shuffle=False, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    for m in (model, loaded):
        m.fit(x, y, batch_size=2, shuffle=False, verbose=0)
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
