"""`DeploymentConfig` on Keras's JAX backend (this process's 2 host
devices): Keras's device names, this process's devices, and what only
TensorFlow's clones do, refused (tests/test_deployment.py checks it on
TensorFlow)."""

import re
import types

import pytest

from keras_clones.clone_model import jax_devices
from keras_clones.clone_model.deployment import DeploymentConfig


def test_the_defaults_are_one_clone_on_the_first_device():
    deployment = DeploymentConfig()
    assert deployment.num_clones == 1
    assert deployment.devices is None
    assert deployment.clone_device(0) == "cpu:0"


def test_num_clones_takes_this_process_first_devices():
    deployment = DeploymentConfig(num_clones=2)
    assert [deployment.clone_device(i) for i in (0, 1)] == ["cpu:0", "cpu:1"]
    assert jax_devices.clone_devices(deployment)[1].id == 1
    too_many = DeploymentConfig(num_clones=3)
    with pytest.raises(ValueError, match="this process has 2: cpu:0, cpu:1"):
        too_many.clone_device(0)


def test_devices_take_keras_names_in_their_order():
    deployment = DeploymentConfig(devices=["CPU:1", " cpu:0"])
    assert deployment.devices == ["cpu:1", "cpu:0"]
    assert deployment.num_clones == 2
    assert deployment.clone_device(0) == "cpu:1"
    restored = DeploymentConfig.from_config(deployment.get_config())
    assert restored == deployment


@pytest.mark.parametrize(
    "device, message",
    [
        ("/gpu:0", "a TensorFlow device string. On Keras's JAX backend"),
        ("/device:CPU:1", "('cpu:1' here)"),
        ("gpu0", "Invalid device name 'gpu0' in `devices`: use Keras's form"),
        ("npu:0", "a platform (cpu, gpu, tpu)"),
    ],
)
def test_other_device_names_are_refused_with_the_name_to_use(device, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        DeploymentConfig(devices=[device])


def test_a_device_name_must_be_a_string():
    with pytest.raises(TypeError, match="such as 'gpu:0'. Received: 0 of"):
        DeploymentConfig(devices=[0])


def test_a_device_not_of_this_process_is_refused_naming_its_own(monkeypatch):
    missing = DeploymentConfig(devices=["cpu:0", "cpu:5"])
    with pytest.raises(
        ValueError,
        match=re.escape(
            "Clone 1 is placed on 'cpu:5', which does not exist: a clone runs "
            "on a device of its own process. This process's devices: cpu:0, "
            "cpu:1."
        ),
    ):
        missing.clone_device(0)
    elsewhere = types.SimpleNamespace(platform="cpu", id=2048, process_index=1)
    local = jax_devices.jax.local_devices()
    monkeypatch.setattr(jax_devices.jax, "devices", lambda: [*local, elsewhere])
    other = DeploymentConfig(devices=["cpu:2048"])
    with pytest.raises(ValueError, match="which is process 1's: a clone"):
        other.clone_device(0)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"clone_on_cpu": True}, "name the clones' CPU devices instead"),
        ({"num_ps_tasks": 1}, "need Keras's TensorFlow backend. On JAX"),
        ({"num_replicas": 2}, "Received: num_replicas=2, num_ps_tasks=0."),
        ({"all_reduce": "nccl"}, "leave `all_reduce` unset"),
    ],
)
def test_what_only_tensorflow_clones_do_is_refused(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        DeploymentConfig(num_clones=2, **options)


def test_replicated_variables_are_accepted_as_every_clone_holds_a_copy():
    deployment = DeploymentConfig(num_clones=2, variable_update="replicated")
    assert deployment.variable_update == "replicated"
