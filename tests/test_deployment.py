import subprocess
import sys

import numpy as np
import pytest

from keras_clones import DeploymentConfig


def test_defaults_are_one_clone_with_default_placement():
    config = DeploymentConfig()
    assert config.num_clones == 1
    assert config.clone_device(0) == ""
    assert config.clone_scope(0) == ""
    assert config.optimizer_device() == "/device:CPU:0"
    assert config.inputs_device() == "/device:CPU:0"
    assert config.variables_device() == "/device:CPU:0"


def test_clones_on_gpus_and_on_cpu():
    config = DeploymentConfig(num_clones=3)
    assert [config.clone_device(i) for i in range(3)] == [
        "/device:GPU:0",
        "/device:GPU:1",
        "/device:GPU:2",
    ]
    assert [config.clone_scope(i) for i in range(3)] == [
        "clone_0",
        "clone_1",
        "clone_2",
    ]
    on_cpu = DeploymentConfig(num_clones=2, clone_on_cpu=True)
    assert on_cpu.clone_device(1) == "/device:CPU:0"
    assert DeploymentConfig(clone_on_cpu=True).clone_device(0) == (
        "/device:CPU:0"
    )


def test_parameter_server_topology_device_strings():
    config = DeploymentConfig(
        num_clones=2, replica_id=1, num_replicas=3, num_ps_tasks=2
    )
    assert config.clone_device(1) == "/job:worker/device:GPU:1"
    assert config.optimizer_device() == "/job:worker/device:CPU:0"
    assert config.inputs_device() == "/job:worker/device:CPU:0"
    assert [config.variables_device(i) for i in range(3)] == [
        "/job:ps/task:0/device:CPU:0",
        "/job:ps/task:1/device:CPU:0",
        "/job:ps/task:0/device:CPU:0",
    ]
    named = DeploymentConfig(
        num_ps_tasks=1, worker_job_name="trainer", ps_job_name="params"
    )
    assert named.worker_device == "/job:trainer"
    assert named.ps_device == "/job:params"
    assert named.clone_device(0) == "/job:trainer"


def test_explicit_devices_are_canonicalised():
    config = DeploymentConfig(devices=["/cpu:0", "/device:GPU:1", "CPU:1"])
    assert config.num_clones == 3
    assert config.devices == ["/device:CPU:0", "/device:GPU:1", "/device:CPU:1"]
    assert config.clone_device(2) == "/device:CPU:1"
    assert config.clone_scope(2) == "clone_2"
    with_ps = DeploymentConfig(devices=["/gpu:0"], num_ps_tasks=1)
    assert with_ps.clone_device(0) == "/job:worker/device:GPU:0"


def test_config_round_trip_and_equality():
    for config in (
        DeploymentConfig(num_clones=2, clone_on_cpu=True),
        DeploymentConfig(devices=["/cpu:0", "/cpu:1"]),
        DeploymentConfig(num_replicas=2, replica_id=1, num_ps_tasks=3),
    ):
        restored = DeploymentConfig.from_config(config.get_config())
        assert restored == config
        assert repr(restored) == repr(config)
    assert DeploymentConfig(num_clones=2) != DeploymentConfig(num_clones=3)


def test_numpy_integers_are_taken_as_python_integers():
    config = DeploymentConfig(
        num_clones=np.int64(2),
        clone_on_cpu=True,
        replica_id=np.int32(1),
        num_replicas=np.int64(2),
        num_ps_tasks=np.int8(1),
    )
    assert config == DeploymentConfig(
        num_clones=2,
        clone_on_cpu=True,
        replica_id=1,
        num_replicas=2,
        num_ps_tasks=1,
    )
    assert all(
        type(value) is int
        for key, value in config.get_config().items()
        if key in ("num_clones", "replica_id", "num_replicas", "num_ps_tasks")
    )
    assert config.clone_scope(np.int64(1)) == "clone_1"
    assert config.variables_device(np.int64(3)).endswith("/task:0/device:CPU:0")
    with pytest.raises(TypeError, match="num_clones=np.True_ of type bool"):
        DeploymentConfig(num_clones=np.bool_(True))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"num_clones": 0}, ValueError, "num_clones` must be >= 1"),
        ({"num_clones": -2}, ValueError, "num_clones` must be >= 1"),
        ({"num_clones": "2"}, TypeError, "num_clones` must be an integer"),
        ({"num_clones": 2.0}, TypeError, "num_clones` must be an integer"),
        ({"replica_id": -1}, ValueError, "replica_id` must be >= 0"),
        ({"num_replicas": 0}, ValueError, "num_replicas` must be >= 1"),
        ({"num_ps_tasks": -1}, ValueError, "num_ps_tasks` must be >= 0"),
        ({"clone_on_cpu": "yes"}, TypeError, "clone_on_cpu` must be a bool"),
        ({"replica_id": 1}, ValueError, r"replica_id` must be in \[0, 1\)"),
        (
            {"num_replicas": 2, "replica_id": 2, "num_ps_tasks": 1},
            ValueError,
            r"replica_id` must be in \[0, 2\).*Received: replica_id=2",
        ),
        (  # The out-of-range index first, before the missing servers.
            {"num_replicas": 2, "replica_id": 3},
            ValueError,
            r"replica_id` must be in \[0, 2\).*Received: replica_id=3",
        ),
        ({"num_replicas": 2}, ValueError, "num_ps_tasks` must be positive"),
        (
            {"num_ps_tasks": 1, "worker_job_name": ""},
            ValueError,
            "worker_job_name",
        ),
        ({"num_ps_tasks": 1, "ps_job_name": None}, ValueError, "ps_job_name"),
        (
            {"num_clones": 2, "devices": ["/cpu:0", "/cpu:1"]},
            ValueError,
            "either `num_clones` or `devices`",
        ),
        ({"devices": []}, ValueError, "at least one device"),
        ({"devices": "/cpu:0"}, TypeError, "list of device strings"),
        ({"devices": [0, 1]}, TypeError, "device string"),
        ({"devices": ["/cpu:0", "/CPU:0"]}, ValueError, "more than once"),
        ({"devices": ["gpu0"]}, ValueError, "Invalid device string 'gpu0'"),
        ({"devices": ["/device:FOO:0"]}, ValueError, "Unknown device type"),
        ({"devices": ["/cpu:*"]}, ValueError, "has no index"),
        ({"devices": ["/job:w/cpu:0"]}, ValueError, "names a job"),
        (
            {"devices": ["/cpu:0"], "clone_on_cpu": True},
            ValueError,
            "clone_on_cpu=True",
        ),
    ],
)
def test_invalid_arguments_name_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        DeploymentConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"variable_update": "mirrored"},
            "`variable_update` must be one of 'parameter_server', "
            "'replicated'. Received: variable_update='mirrored'.",
        ),
        (
            {"variable_update": "replicated", "all_reduce": "ring"},
            "`all_reduce` must be None or one of 'reduction_to_one_device', "
            "'hierarchical_copy', 'nccl'. Received: all_reduce='ring'.",
        ),
        (
            {"all_reduce": "nccl"},
            "`all_reduce` chooses how replicated variables are kept in sync, "
            "so it needs `variable_update='replicated'`. Received: "
            "all_reduce='nccl', variable_update='parameter_server'.",
        ),
        (
            {
                "num_clones": 3,
                "variable_update": "replicated",
                "all_reduce": "hierarchical_copy",
            },
            "`all_reduce='hierarchical_copy'` needs an even number of "
            "clones, at most 8: with an odd number TensorFlow's "
            "`HierarchicalCopyAllReduce` leaves out the last device's "
            "values. Received 3 clones; use "
            "`all_reduce='reduction_to_one_device'` (or None).",
        ),
        (
            {
                "num_clones": 2,
                "clone_on_cpu": True,
                "variable_update": "replicated",
            },
            "`variable_update='replicated'` keeps a copy of the variables on "
            "each clone's device, but `clone_on_cpu=True` puts every clone "
            "on '/device:CPU:0'. List distinct devices in `devices=[...]`, "
            "or use `variable_update='parameter_server'`.",
        ),
        (
            {"num_ps_tasks": 1, "variable_update": "replicated"},
            "`variable_update='replicated'` keeps the variables on the clone "
            "devices, while parameter servers hold the one copy; use "
            "`num_ps_tasks=0`. Received: num_ps_tasks=1.",
        ),
    ],
)
def test_invalid_variable_update_and_all_reduce(kwargs, message):
    with pytest.raises(ValueError) as error:
        DeploymentConfig(**kwargs)
    assert str(error.value) == message


@pytest.mark.parametrize("index", [-1, 2, 5])
def test_clone_index_out_of_range(index):
    config = DeploymentConfig(num_clones=2)
    with pytest.raises(ValueError, match=r"clone_index` must be in \[0, 2\)"):
        config.clone_device(index)
    with pytest.raises(ValueError, match=r"clone_index` must be in \[0, 2\)"):
        config.clone_scope(index)


def test_check_devices_lists_existing_devices():
    DeploymentConfig(devices=["/cpu:0", "/cpu:1"]).check_devices()
    with pytest.raises(ValueError, match=r"'/device:GPU:0'.*/device:CPU:1"):
        DeploymentConfig(num_clones=2).check_devices()


def test_construction_does_not_start_the_tensorflow_runtime():
    code = (
        "import tensorflow as tf\n"
        "from keras_clones import DeploymentConfig\n"
        "DeploymentConfig(devices=['/cpu:0', '/cpu:1'])\n"
        "cpu = tf.config.list_physical_devices('CPU')[0]\n"
        "tf.config.set_logical_device_configuration(\n"
        "    cpu, [tf.config.LogicalDeviceConfiguration()] * 2)\n"
        "print(len(tf.config.list_logical_devices('CPU')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("2")


def run_as_if_under_torch(code):
    """`code` run in a Python where Keras reports the torch backend (its
    `keras.backend.backend()` patched before keras_clones is imported:
    the test venv has TensorFlow, neither torch nor JAX, under which
    `CloneModel` runs too: tests_jax/)."""
    patch = "import keras\nkeras.backend.backend = lambda: 'torch'\n"
    return subprocess.run(
        [sys.executable, "-c", patch + code], capture_output=True, text=True
    )


def test_import_works_under_another_backend_and_says_how_to_switch_at_use():
    # An unknown name is an AttributeError there too (`hasattr` is False).
    result = run_as_if_under_torch(
        "import keras_clones\n"
        "print(hasattr(keras_clones, 'nothing'))\n"
        "print(keras_clones.ComputedStep.__name__)\n"
        "keras_clones.CloneModel\n"
    )
    assert result.returncode != 0
    assert result.stdout.split() == ["False", "ComputedStep"]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "ImportError: `keras_clones.CloneModel` needs the TensorFlow backend "
        "of Keras, but Keras is set to the 'torch' backend."
    )
    assert "KERAS_BACKEND=tensorflow" in last


@pytest.mark.parametrize("module", ["launch", "cost_model"])
def test_the_launcher_and_the_cost_model_start_under_any_backend(module):
    env = {"KERAS_BACKEND": "jax", "PATH": ""}
    result = subprocess.run(
        [sys.executable, "-m", f"keras_clones.{module}", "--help"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m keras_clones.")
