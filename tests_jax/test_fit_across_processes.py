"""What `fit` does across JAX processes, launched as a user launches it
(tests_jax/workers/fit_behaviours.py on 2 processes): progress bars, stops
and nan checks on every process alike, `PostInitCopy`, `evaluate`, files
written once; what is refused alike on each (processes that disagree on
the model, one that runs alone, parameter servers); the example, on 2
workers of 2 devices with its kernels split by `ModelParallel`."""

import json
import os
import pathlib
import re
import subprocess
import sys
import types

import numpy as np
import pytest
from launching import WORKERS
from launching import launch

sys.path.insert(0, str(WORKERS))

import variants  # noqa: E402


@pytest.fixture(scope="module")
def launched_behaviours(tmp_path_factory):
    out = tmp_path_factory.mktemp("behaviours")
    result = launch(WORKERS / "fit_behaviours.py", out)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr
    found = [
        json.loads((out / f"behaviours.{p}.json").read_text()) for p in (0, 1)
    ]
    return found, result.stdout, out


def test_only_process_0_shows_the_progress_bar_under_verbose_auto(
    launched_behaviours,
):
    _, output, _ = launched_behaviours
    bars = [line for line in output.splitlines() if "12/12" in line]
    assert bars and all(line.startswith("[worker 0]") for line in bars)


def test_a_stop_on_one_process_stops_every_process_at_that_epoch_end(
    launched_behaviours,
):
    found, _, _ = launched_behaviours
    assert [f["iterations_after_a_stop"] for f in found] == [12, 12]


def test_a_stop_from_the_logs_stops_every_process_at_the_same_step(
    launched_behaviours,
):
    found, _, _ = launched_behaviours
    stopped = [f["iterations_after_a_stop_from_the_logs"] for f in found]
    assert stopped[0] == stopped[1] < 36  # Of 3 epochs of 12.


def test_a_nan_on_one_process_raises_on_both_at_the_commit(
    launched_behaviours,
):
    found, _, _ = launched_behaviours
    # Process 1's batch 1 is a nan: skipped there alone, reported at the
    # commit of the period (step 4), where both raise, naming it.
    assert [f["iterations_at_the_raise"] for f in found] == [4, 4]
    for raised in (f["raised"] for f in found):
        assert raised[0] == "RuntimeError"
        assert "is not finite at optimizer step 1" in raised[1]
    assert found[0]["raised"] == found[1]["raised"]


def test_post_init_copy_at_a_period_end_gives_every_process_the_chiefs(
    launched_behaviours,
):
    found, _, _ = launched_behaviours
    weights = [np.array(f["weights_after_a_copy"]) for f in found]
    centers = [np.array(f["centers_after_a_copy"]) for f in found]
    np.testing.assert_array_equal(weights[0], weights[1])
    np.testing.assert_array_equal(centers[0], weights[0])
    np.testing.assert_array_equal(centers[1], weights[0])


def test_evaluate_gives_the_result_over_every_process_rows(
    launched_behaviours,
):
    found, _, _ = launched_behaviours
    assert found[0]["evaluated"] == found[1]["evaluated"]
    own = [f["own_loss"] for f in found]
    np.testing.assert_allclose(found[0]["evaluated"], np.mean(own), rtol=1e-5)


@pytest.mark.parametrize(
    "case, error, message",
    [
        ("steps_differ", "ValueError", "would run [11, 12] (by process)"),
        ("rows_differ", "ValueError", "have [95, 96] rows (by process)"),
        ("length_unknown", "ValueError", "Pass `steps_per_epoch`"),
        ("no_agn", "ValueError", "neither an `AGNOptimizer` nor a"),
        ("train_on_batch", "NotImplementedError", "Use `fit`"),
        ("run_eagerly", "ValueError", "`run_eagerly=False`"),
        (
            "distribution",
            "ValueError",
            "the distribution's mesh has 2 devices: a mesh of every "
            "worker's devices would make every local step synchronous",
        ),
        (
            "distribution_auto_shard",
            "ValueError",
            "Pass `auto_shard_dataset=False`",
        ),
    ],
)
def test_what_cannot_run_across_processes_is_refused_alike_on_each(
    launched_behaviours, case, error, message
):
    found, _, _ = launched_behaviours
    for refused in (f[case] for f in found):
        assert refused is not None and refused[0] == error
        assert message in refused[1]


def named(field, *values):
    """What each process names of `field`, by its value there (a regex)."""
    return [re.escape(f"{field} (here: {value})") for value in values]


def kernel(model, *shapes):
    """What each process names of `model`'s first kernel, by its shape
    there (a regex)."""
    return [
        rf'weights\[0\] \(here: "{model}/dense_\d+/kernel {re.escape(shape)} '
        r'float32"\)'
        for shape in shapes
    ]


# What process 1 changed (tests_jax/workers/fit_behaviours.py's
# `differing`): the first field each process names, by process.
DIFFERENCES = {
    "activation": named(
        "model.layers[1].config.activation", '"tanh"', '"relu"'
    ),
    "width": named("model.layers[1].config.units", 4, 5),
    "learning_rate": named(
        "compile.optimizer.config.optimizer.config.learning_rate",
        0.009999999776482582,
        0.019999999552965164,
    ),
    "period": named("compile.optimizer.config.communication_period", 4, 2),
    # A subclass built by `fit` on rows of 5 or 6 features: checked again
    # once built, before its variables travel.
    "features": kernel("lazy_mlp", "(5, 4)", "(6, 4)"),
}


@pytest.mark.parametrize("difference", sorted(DIFFERENCES))
def test_processes_that_disagree_on_the_model_are_refused_naming_it(
    launched_behaviours, difference
):
    # Each process names the field, its own value and the other process,
    # before a collective shaped by the model: a width, period or input
    # that differs would otherwise abort in gloo, an activation or
    # learning rate train silently.
    found, _, _ = launched_behaviours
    for process, refused in enumerate(f[difference] for f in found):
        assert refused is not None and refused[0] == "ValueError"
        assert refused[1].startswith(
            "The processes do not agree on the model and its compilation; "
            "every process must run the same script with the same "
            f"configuration. Process {process} (this process) differs from "
            f"process {1 - process} in: "
        )
        named = DIFFERENCES[difference][process]
        assert re.search(rf"in: {named}[;.]", refused[1]), refused[1]
        if difference == "width":  # The layer's variables, by path.
            shape = f"(5, {4 + process})"
            assert re.search(kernel(r"sequential_\d+", shape)[0], refused[1])


def test_files_are_written_once_by_process_0(launched_behaviours):
    _, _, out = launched_behaviours
    assert sorted(p.name for p in out.glob("model.*")) == [
        "model.0.keras",
        "model.0.weights.h5",
    ]
    assert len((out / "log.csv").read_text().splitlines()) == 3  # 2 epochs.
    assert [p.name for p in out.glob("tensorboard.*")] == ["tensorboard.0"]
    import keras

    import keras_clones  # noqa: F401  (Registers AGNOptimizer.)

    loaded = keras.saving.load_model(out / "checkpoint.keras")
    assert int(loaded.optimizer.iterations.numpy()) == 2 * variants.BATCHES


def test_a_process_started_as_one_of_two_that_runs_alone_is_refused():
    # The script forgot `keras.distribution.initialize()`.
    code = (
        "import keras, numpy as np, keras_clones\n"
        "model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])\n"
        "model.compile(keras.optimizers.SGD(), 'mse')\n"
        "model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)\n"
    )
    env = dict(os.environ, KERAS_DISTRIBUTION_NUM_PROCESSES="2")
    env.pop("XLA_FLAGS", None)
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True
    )
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "RuntimeError: This process was started as one of 2 "
        "(KERAS_DISTRIBUTION_NUM_PROCESSES=2), but JAX runs in this process "
        "alone"
    )
    assert "keras.distribution.initialize()" in last


def test_the_launcher_picks_the_backend_as_keras_does(tmp_path, monkeypatch):
    from keras_clones import launch

    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    assert launch.keras_backend() == "tensorflow"  # Keras's default.
    (tmp_path / "keras.json").write_text('{"backend": "jax"}')
    assert launch.keras_backend() == "jax"
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    assert launch.keras_backend() == "torch"


def test_parameter_servers_on_jax_are_refused_by_the_launcher(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    result = launch("--ps", 1, script)
    assert result.returncode == 2
    assert "--ps needs Keras's TensorFlow backend" in result.stderr


def test_the_example_trains_two_workers_of_two_devices_its_kernels_split(
    tmp_path,
):
    example = (
        pathlib.Path(__file__).parents[1] / "examples" / "jax_processes.py"
    )
    result = launch(
        example,
        "--epochs",
        1,
        "--backup",
        tmp_path / "backup",
        "--model-parallel",
        devices=2,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr
    said = re.search(
        r"\[worker 0\] held-out accuracy of the centers: ([\d.]+)",
        result.stdout,
    )
    assert said and float(said.group(1)) > 0.5  # Ten classes: 0.1 by chance.
    assert "[worker 1] held-out" not in result.stdout
    assert "a device holds (20, 32) of the first kernel's (20, 64)" in (
        result.stdout
    )


def test_processes_with_different_numbers_of_devices_are_refused(monkeypatch):
    from keras_clones.jax_processes import workers

    devices = [
        types.SimpleNamespace(id=i, process_index=p)
        for i, p in enumerate((0, 0, 1, 1, 1))
    ]
    monkeypatch.setattr(workers.jax, "devices", lambda: devices)
    with pytest.raises(ValueError, match=re.escape("they have [2, 3] (by")):
        workers._mesh(2, 1, (0, 1))


def test_the_one_script_for_both_backends_trains_clones_across_workers():
    # examples/across_workers.py, the README's "Across workers", on 2
    # workers of 2 clones (tests/test_examples.py runs it on TensorFlow).
    example = (
        pathlib.Path(__file__).parents[1] / "examples" / "across_workers.py"
    )
    result = launch(example, "--clones", 2, "--epochs", 1, devices=2)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr
    said = re.search(
        r"\[worker 0\] held-out accuracy of the global centers: ([\d.]+)",
        result.stdout,
    )
    assert said and float(said.group(1)) > 0.5  # Ten classes: 0.1 by chance.
    assert (
        "[worker 0] logged: accuracy, clone_0_loss, clone_1_loss, "
        "communication_rounds, loss"
    ) in result.stdout
