"""A `DeploymentConfig`'s clone devices on Keras's JAX backend: Keras's
device names (`"gpu:0"`, `"cpu:1"`: the platform and JAX's device id, as
`keras.distribution.list_devices()` gives them) checked for their form,
and resolved to this process's JAX devices."""

import re

import jax

_PLATFORMS = ("cpu", "gpu", "tpu")
_KERAS_NAME = re.compile(r"(?P<platform>[a-z]+):(?P<id>\d+)")


def device_name(device):
    """A JAX device's Keras name: its platform and id (`"gpu:0"`), as
    `keras_device_name` checks a name given."""
    return f"{device.platform}:{device.id}"


def local_devices_named(names):
    """This process's JAX devices of Keras's `names`, in their order."""
    by_name = {device_name(d): d for d in jax.local_devices()}
    return [by_name[n] for n in names]


def keras_device_name(device):
    """`device`, a clone device of `devices=`, checked for Keras's form
    (`"gpu:0"`) and lower-cased; TensorFlow's form (`"/gpu:0"`,
    `"/device:GPU:0"`) is refused with the name to use."""
    if not isinstance(device, str):
        raise TypeError(
            "Each entry of `devices` must be a device name such as 'gpu:0'. "
            f"Received: {device!r} of type {type(device).__name__}."
        )
    name = device.strip().lower()
    if name.startswith("/"):
        tensorflow = re.fullmatch(r"/(?:device:)?([a-z]+):(\d+)", name)
        said = tensorflow and f" ('{tensorflow[1]}:{tensorflow[2]}' here)"
        raise ValueError(
            f"{device!r} in `devices` is a TensorFlow device string. On "
            "Keras's JAX backend, name clone devices as Keras does, the "
            f"platform and JAX's device id{said or ''}: 'gpu:0', 'cpu:1', "
            "as `keras.distribution.list_devices()` lists them."
        )
    found = _KERAS_NAME.fullmatch(name)
    if found is None or found["platform"] not in _PLATFORMS:
        raise ValueError(
            f"Invalid device name {device!r} in `devices`: use Keras's form, "
            f"a platform ({', '.join(_PLATFORMS)}) and JAX's device id, as "
            "in 'gpu:0' or 'cpu:1' (`keras.distribution.list_devices()`)."
        )
    return f"{found['platform']}:{int(found['id'])}"


def clone_devices(deployment):
    """The JAX devices of `deployment`'s clones, in clone order: those its
    `devices` name, or the first `num_clones` of this process's devices.
    Raises `ValueError` for a device that is not this process's (naming
    this process's devices)."""
    local = jax.local_devices()
    names = [device_name(d) for d in local]
    if deployment.devices is None:
        if deployment.num_clones > len(local):
            raise ValueError(
                f"`num_clones={deployment.num_clones}` needs as many devices, "
                f"but this process has {len(local)}: {', '.join(names)}. "
                "Pass a smaller `num_clones`, or give the process more "
                "devices (on CPU, `XLA_FLAGS="
                "--xla_force_host_platform_device_count=N` before JAX "
                "starts)."
            )
        return local[: deployment.num_clones]
    by_name = dict(zip(names, local))
    others = {device_name(d): d for d in jax.devices()}
    devices = []
    for i, name in enumerate(deployment.devices):
        if name not in by_name:
            where = "does not exist"
            if name in others:
                where = f"is process {others[name].process_index}'s"
            raise ValueError(
                f"Clone {i} is placed on {name!r}, which {where}: a clone "
                "runs on a device of its own process. This process's "
                f"devices: {', '.join(names)}."
            )
        devices.append(by_name[name])
    return devices


def existing_clone_devices(deployment):
    """The devices of `deployment`'s clones that are this process's, in
    clone order (this process's first device where none is), and the
    names of those that are not (`"clone 2's"` for the clones of
    `num_clones` beyond this process's devices), empty where every one
    is."""
    local = jax.local_devices()
    if deployment.devices is None:
        count = deployment.num_clones
        missing = [f"clone {i}'s" for i in range(len(local), count)]
        return local[:count], missing
    by_name = {device_name(d): d for d in local}
    found = [by_name[n] for n in deployment.devices if n in by_name]
    missing = [n for n in deployment.devices if n not in by_name]
    return found or local[:1], missing
