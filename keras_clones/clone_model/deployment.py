"""Where the clones of a model run: devices, name scopes and placement."""

import numbers

from keras_clones._tensorflow import ON_TENSORFLOW
from keras_clones._tensorflow import tf

_KNOWN_DEVICE_TYPES = ("CPU", "GPU", "TPU")
_VARIABLE_UPDATES = ("parameter_server", "replicated")
# tf.distribute's cross-device ops (their class names), by the name
# `all_reduce` takes.
_ALL_REDUCES = {
    "reduction_to_one_device": "ReductionToOneDevice",
    "hierarchical_copy": "HierarchicalCopyAllReduce",
    "nccl": "NcclAllReduce",
}


def _hierarchical_copy_sums(num_clones):
    """Device counts `tf.distribute.HierarchicalCopyAllReduce` sums right.

    With an odd number of devices (TensorFlow 2.21) it drops the last
    device's values; it is tested here for 2, 4, 6 and 8.
    """
    return num_clones in (1, 2, 4, 6, 8)


def _check_count(name, value, minimum):
    """`value` as a Python `int` (a NumPy integer too), if it is an integer
    of at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"`{name}` must be an integer. Received: {name}={value!r} "
            f"of type {type(value).__name__}."
        )
    if value < minimum:
        raise ValueError(
            f"`{name}` must be >= {minimum}. Received: {name}={value}."
        )
    return int(value)


def _parse_clone_device(device):
    """Returns the canonical form of a clone device: `/device:TYPE:INDEX`
    on TensorFlow, Keras's `type:index` on JAX."""
    if not ON_TENSORFLOW:
        from keras_clones.clone_model import jax_devices

        return jax_devices.keras_device_name(device)
    if not isinstance(device, str):
        raise TypeError(
            "Each entry of `devices` must be a device string such as "
            f"'/device:GPU:0'. Received: {device!r} of type "
            f"{type(device).__name__}."
        )
    try:
        spec = tf.DeviceSpec.from_string(device)
    except ValueError as e:
        raise ValueError(
            f"Invalid device string {device!r} in `devices`: {e} "
            "Use the form '/device:GPU:0' or '/cpu:1'."
        ) from None
    if spec.device_type not in _KNOWN_DEVICE_TYPES:
        raise ValueError(
            f"Unknown device type in {device!r} in `devices`: expected one "
            f"of {', '.join(_KNOWN_DEVICE_TYPES)}, as in '/device:GPU:0'."
        )
    if spec.device_index is None:
        raise ValueError(
            f"Device {device!r} in `devices` has no index: name one device, "
            "as in '/device:GPU:0'."
        )
    if spec.job or spec.replica is not None or spec.task is not None:
        raise ValueError(
            f"Device {device!r} in `devices` names a job, replica or task. "
            "Give local devices only ('/device:GPU:0'); the job prefix comes "
            "from `worker_job_name` when `num_ps_tasks > 0`."
        )
    return tf.DeviceSpec(
        device_type=spec.device_type, device_index=spec.device_index
    ).to_string()


def _local_devices():
    """This machine's logical devices, as local device strings."""
    return {
        tf.DeviceSpec.from_string(d.name)
        .replace(job=None, replica=None, task=None)
        .to_string()
        for d in tf.config.list_logical_devices()
    }


def _check_devices(devices, num_clones, clone_on_cpu):
    """Checks `devices` and returns it canonicalised, as a list.

    `devices` gives one clone per device, so it excludes `num_clones` and
    `clone_on_cpu=True`.
    """
    _check_num_clones_without_devices(num_clones, devices)
    _check_device_list(devices)
    _check_clone_on_cpu_without_devices(clone_on_cpu)
    devices = [_parse_clone_device(d) for d in devices]
    _check_distinct_devices(devices)
    return devices


def _check_num_clones_without_devices(num_clones, devices):
    if num_clones is not None:
        raise ValueError(
            "Pass either `num_clones` or `devices`, not both: "
            "`devices` gives one clone per device. Received: "
            f"num_clones={num_clones}, devices={devices!r}."
        )


def _check_device_list(devices):
    if isinstance(devices, str) or not isinstance(devices, (list, tuple)):
        raise TypeError(
            "`devices` must be a list of device strings, such as "
            f"['/cpu:0', '/cpu:1']. Received: {devices!r}."
        )
    if not devices:
        raise ValueError(
            "`devices` must name at least one device. Received: []."
        )


def _check_clone_on_cpu_without_devices(clone_on_cpu):
    if clone_on_cpu:
        raise ValueError(
            "`clone_on_cpu=True` places every clone on "
            "'/device:CPU:0' and cannot be combined with `devices`. "
            "List CPU devices in `devices` instead."
        )


def _check_distinct_devices(devices):
    duplicates = sorted({d for d in devices if devices.count(d) > 1})
    if duplicates:
        raise ValueError(
            f"`devices` lists {', '.join(duplicates)} more than once; "
            "each clone needs its own device."
        )


def _check_clone_on_cpu(clone_on_cpu):
    if not isinstance(clone_on_cpu, bool):
        raise TypeError(
            f"`clone_on_cpu` must be a bool. Received: {clone_on_cpu!r}."
        )


def _check_ps_tasks_for_replicas(num_replicas, num_ps_tasks):
    if num_replicas > 1 and num_ps_tasks < 1:
        raise ValueError(
            "`num_ps_tasks` must be positive when `num_replicas > 1`: "
            "replicas share their variables through parameter servers. "
            f"Received: num_replicas={num_replicas}, "
            f"num_ps_tasks={num_ps_tasks}."
        )


def _check_job_name(name, value):
    """Checks `worker_job_name` or `ps_job_name` (with parameter servers)."""
    if not isinstance(value, str) or not value:
        raise ValueError(
            f"`{name}` must be a non-empty string when using "
            f"replicas or parameter servers. Received: "
            f"{name}={value!r}."
        )


def _check_replica_id_in_range(replica_id, num_replicas):
    if replica_id >= num_replicas:
        raise ValueError(
            f"`replica_id` must be in [0, {num_replicas}) for "
            f"num_replicas={num_replicas}, the index of this replica. "
            f"Received: replica_id={replica_id}."
        )


def _check_variable_update(variable_update):
    if variable_update not in _VARIABLE_UPDATES:
        raise ValueError(
            "`variable_update` must be one of "
            f"{', '.join(map(repr, _VARIABLE_UPDATES))}. Received: "
            f"variable_update={variable_update!r}."
        )


def _check_all_reduce(all_reduce):
    if all_reduce is not None and all_reduce not in _ALL_REDUCES:
        raise ValueError(
            "`all_reduce` must be None or one of "
            f"{', '.join(map(repr, _ALL_REDUCES))}. Received: "
            f"all_reduce={all_reduce!r}."
        )


def _check_all_reduce_is_replicated(all_reduce, variable_update):
    if all_reduce is not None and variable_update != "replicated":
        raise ValueError(
            "`all_reduce` chooses how replicated variables are kept "
            "in sync, so it needs `variable_update='replicated'`. "
            f"Received: all_reduce={all_reduce!r}, "
            f"variable_update={variable_update!r}."
        )


def _check_hierarchical_copy_clones(all_reduce, num_clones):
    if all_reduce == "hierarchical_copy" and not _hierarchical_copy_sums(
        num_clones
    ):
        raise ValueError(
            "`all_reduce='hierarchical_copy'` needs an even number of "
            "clones, at most 8: with an odd number TensorFlow's "
            "`HierarchicalCopyAllReduce` leaves out the last device's "
            f"values. Received {num_clones} clones; use "
            "`all_reduce='reduction_to_one_device'` (or None)."
        )


def _check_replicated_clone_devices(variable_update, clone_on_cpu, num_clones):
    if variable_update == "replicated" and clone_on_cpu and num_clones > 1:
        raise ValueError(
            "`variable_update='replicated'` keeps a copy of the "
            "variables on each clone's device, but `clone_on_cpu=True` "
            "puts every clone on '/device:CPU:0'. List distinct devices "
            "in `devices=[...]`, or use "
            "`variable_update='parameter_server'`."
        )


def _check_tensorflow_only(
    clone_on_cpu, num_replicas, num_ps_tasks, all_reduce
):
    """On Keras's JAX backend, refuses what only TensorFlow's clones do."""
    if ON_TENSORFLOW:
        return
    if clone_on_cpu:
        raise ValueError(
            "`clone_on_cpu=True` is TensorFlow's way to run every clone on "
            "'/device:CPU:0'. On Keras's JAX backend, name the clones' CPU "
            "devices instead: `devices=['cpu:0', 'cpu:1']`."
        )
    if num_ps_tasks or num_replicas > 1:
        raise ValueError(
            "Replicas on parameter servers (`num_replicas`, `num_ps_tasks`) "
            "need Keras's TensorFlow backend. On JAX, train across "
            "processes with `python -m keras_clones.launch --workers N` and "
            f"an `AGNOptimizer`. Received: num_replicas={num_replicas}, "
            f"num_ps_tasks={num_ps_tasks}."
        )
    if all_reduce is not None:
        raise ValueError(
            "`all_reduce` picks TensorFlow's cross-device all-reduce. On "
            "Keras's JAX backend the clones' gradients are all-reduced by "
            "XLA's collectives within one program; leave `all_reduce` "
            f"unset. Received: all_reduce={all_reduce!r}."
        )


def _check_replicated_without_ps(variable_update, num_ps_tasks):
    if variable_update == "replicated" and num_ps_tasks > 0:
        raise ValueError(
            "`variable_update='replicated'` keeps the variables on the "
            "clone devices, while parameter servers hold the one copy; "
            f"use `num_ps_tasks=0`. Received: num_ps_tasks={num_ps_tasks}."
        )


class DeploymentConfig:
    """How to deploy a model as clones on the devices of one machine.

    This is TF-Slim's `model_deploy.DeploymentConfig`: each replica (worker
    process) runs `num_clones` clones of the model, each on its own device
    and under its own name scope. `CloneModel` reads it to split each batch.

    Clone `i` runs on `/device:GPU:i`, or on `/device:CPU:0` when
    `clone_on_cpu=True`. A single clone without `clone_on_cpu` is left to
    TensorFlow's default placement. `devices` names the clone devices
    explicitly instead, e.g. `devices=["/cpu:0", "/cpu:1"]` for two logical
    CPU devices.

    `variable_update` chooses where the trainable variables live.
    `"parameter_server"` (model_deploy's way) keeps one copy, which every
    clone reads at every step. `"replicated"` (tf_cnn_benchmarks'
    `VariableMgrLocalReplicated`) keeps a copy of every trainable variable,
    and of the optimizer state its update needs, on every clone device: the
    clones' gradients are all-reduced with `all_reduce` and every copy
    applies the same update, so the copies stay identical.

    `replica_id`, `num_replicas`, `num_ps_tasks` and the job names describe a
    parameter-server topology: they prefix device strings with
    `/job:<worker_job_name>` and spread variables round-robin over
    `/job:<ps_job_name>/task:k`. `CloneModel` trains with `num_ps_tasks > 0`
    only under `tf.distribute.ParameterServerStrategy`, whose cluster places
    the variables; there the defaults take the cluster as it is, and values
    that contradict it are refused.

    Device strings are checked for syntax here, without starting the
    TensorFlow runtime (so logical devices can still be configured), and
    for existence when `fit` starts. `evaluate` and `predict` run on the
    clone devices that exist (`on_existing_devices`).

    On Keras's JAX backend the defaults are the same (one clone);
    `num_clones=N` takes the first N of this process's devices, and
    `devices` takes Keras's device names, the platform and JAX's device id
    as `keras.distribution.list_devices()` gives them (`"gpu:0"`,
    `"cpu:1"`; TensorFlow's `"/gpu:0"` is refused with the name to use).
    Every clone's device holds a copy of the variables there, whatever
    `variable_update` says; `clone_on_cpu`, parameter servers and
    `all_reduce` are TensorFlow's and refused.

    Args:
        num_clones: Number of clones per replica. Defaults to 1, or to
            `len(devices)` when `devices` is given; exclusive with `devices`.
        clone_on_cpu: If `True`, every clone is placed on `/device:CPU:0`.
        replica_id: Index of this replica (worker), 0 for the chief.
        num_replicas: Number of replicas. More than one needs
            `num_ps_tasks > 0`.
        num_ps_tasks: Number of parameter-server tasks; 0 for none.
        worker_job_name: Name of the worker job.
        ps_job_name: Name of the parameter-server job.
        devices: Optional list of clone devices, one per clone.
        variable_update: `"parameter_server"` (the default) or
            `"replicated"`.
        all_reduce: With `variable_update="replicated"`, TensorFlow's
            cross-device all-reduce to use: `"reduction_to_one_device"`
            (`tf.distribute.ReductionToOneDevice`), `"hierarchical_copy"`
            (`tf.distribute.HierarchicalCopyAllReduce`) or `"nccl"`
            (`tf.distribute.NcclAllReduce`, physical GPUs only). By default
            NCCL when the clones run on distinct physical GPUs, hierarchical
            copy on logical GPUs of one GPU (2, 4, 6 or 8 of them: with an
            odd number it drops a device's values), else reduction to one
            device.

    Example:

    ```python
    deployment = keras_clones.DeploymentConfig(devices=["/cpu:0", "/cpu:1"])
    deployment.clone_device(1)  # '/device:CPU:1'
    deployment.clone_scope(1)  # 'clone_1'
    ```
    """

    def __init__(
        self,
        num_clones=None,
        clone_on_cpu=False,
        replica_id=0,
        num_replicas=1,
        num_ps_tasks=0,
        worker_job_name="worker",
        ps_job_name="ps",
        devices=None,
        variable_update="parameter_server",
        all_reduce=None,
    ):
        if devices is not None:
            devices = _check_devices(devices, num_clones, clone_on_cpu)
            num_clones = len(devices)
        elif num_clones is None:
            num_clones = 1
        num_clones = _check_count("num_clones", num_clones, 1)
        _check_clone_on_cpu(clone_on_cpu)
        replica_id = _check_count("replica_id", replica_id, 0)
        num_replicas = _check_count("num_replicas", num_replicas, 1)
        num_ps_tasks = _check_count("num_ps_tasks", num_ps_tasks, 0)
        _check_tensorflow_only(
            clone_on_cpu, num_replicas, num_ps_tasks, all_reduce
        )
        _check_replica_id_in_range(replica_id, num_replicas)
        _check_ps_tasks_for_replicas(num_replicas, num_ps_tasks)
        # With more than one replica there are parameter servers (above).
        uses_ps = num_ps_tasks > 0
        if uses_ps:
            _check_job_name("worker_job_name", worker_job_name)
            _check_job_name("ps_job_name", ps_job_name)
        _check_variable_update(variable_update)
        _check_all_reduce(all_reduce)
        _check_all_reduce_is_replicated(all_reduce, variable_update)
        _check_hierarchical_copy_clones(all_reduce, num_clones)
        _check_replicated_clone_devices(
            variable_update, clone_on_cpu, num_clones
        )
        _check_replicated_without_ps(variable_update, num_ps_tasks)
        self._num_clones = num_clones
        self._clone_on_cpu = clone_on_cpu
        self._replica_id = replica_id
        self._num_replicas = num_replicas
        self._num_ps_tasks = num_ps_tasks
        self._worker_job_name = worker_job_name
        self._ps_job_name = ps_job_name
        self._devices = devices
        self._variable_update = variable_update
        self._all_reduce = all_reduce
        self._worker_device = f"/job:{worker_job_name}" if uses_ps else ""
        self._ps_device = f"/job:{ps_job_name}" if uses_ps else ""

    @property
    def num_clones(self):
        return self._num_clones

    @property
    def clone_on_cpu(self):
        return self._clone_on_cpu

    @property
    def replica_id(self):
        return self._replica_id

    @property
    def num_replicas(self):
        return self._num_replicas

    @property
    def num_ps_tasks(self):
        return self._num_ps_tasks

    @property
    def worker_device(self):
        """`/job:<worker_job_name>` with parameter servers, else `''`."""
        return self._worker_device

    @property
    def ps_device(self):
        """`/job:<ps_job_name>` with parameter servers, else `''`."""
        return self._ps_device

    @property
    def devices(self):
        """The explicit clone devices, canonicalised, or `None`."""
        return None if self._devices is None else list(self._devices)

    @property
    def variable_update(self):
        return self._variable_update

    @property
    def all_reduce(self):
        """The `all_reduce` asked for, or `None` for the default."""
        return self._all_reduce

    def cross_device_ops(self):
        """The `tf.distribute.CrossDeviceOps` for replicated variables.

        It reads the machine's devices, so it initialises the TensorFlow
        runtime. Raises `ValueError` if `all_reduce` cannot run on the clone
        devices.
        """
        devices = [
            tf.DeviceSpec.from_string(self.clone_device(i))
            for i in range(self._num_clones)
        ]
        on_gpus = all(d.device_type == "GPU" for d in devices)
        physical = len(tf.config.list_physical_devices("GPU"))
        shared = len(tf.config.list_logical_devices("GPU")) > physical
        name = self._all_reduce
        if name is None:
            name = "reduction_to_one_device"
            if on_gpus and not shared:
                name = "nccl"
            elif on_gpus and _hierarchical_copy_sums(self._num_clones):
                name = "hierarchical_copy"
        if name == "nccl" and not on_gpus:
            raise ValueError(
                "`all_reduce='nccl'` needs every clone on a GPU, but the "
                f"clones run on {[d.to_string() for d in devices]}. Use "
                "`all_reduce='reduction_to_one_device'` (or None)."
            )
        if name == "nccl" and shared:
            raise ValueError(
                "`all_reduce='nccl'` cannot run on logical GPUs that share "
                f"a physical GPU (this machine has {physical} physical GPU(s) "
                "split into more logical ones). Use "
                "`all_reduce='hierarchical_copy'` (or None)."
            )
        return getattr(tf.distribute, _ALL_REDUCES[name])()

    def _check_clone_index(self, clone_index):
        if isinstance(clone_index, bool) or not isinstance(
            clone_index, numbers.Integral
        ):
            raise TypeError(
                f"`clone_index` must be an integer. Received: {clone_index!r}."
            )
        if not 0 <= clone_index < self._num_clones:
            raise ValueError(
                f"`clone_index` must be in [0, {self._num_clones}) for "
                f"{self._num_clones} clone(s). Received: {clone_index}."
            )

    def clone_device(self, clone_index):
        """Device for clone `clone_index`, a value for `tf.device()`; on
        JAX, its Keras name (this process's devices checked)."""
        self._check_clone_index(clone_index)
        if not ON_TENSORFLOW:
            from keras_clones.clone_model import jax_devices

            devices = jax_devices.clone_devices(self)
            return jax_devices.device_name(devices[clone_index])
        if self._devices is not None:
            return self._worker_device + self._devices[clone_index]
        device = self._worker_device
        if self._clone_on_cpu:
            device += "/device:CPU:0"
        elif self._num_clones > 1:
            device += f"/device:GPU:{clone_index}"
        return device

    def clone_scope(self, clone_index):
        """Name scope of clone `clone_index`: `clone_i`, or `''` alone."""
        self._check_clone_index(clone_index)
        return f"clone_{clone_index}" if self._num_clones > 1 else ""

    def optimizer_device(self):
        """Device where the clones' gradients are summed and applied."""
        return self._worker_device + "/device:CPU:0"

    def inputs_device(self):
        """Device where the input pipeline runs."""
        return self._worker_device + "/device:CPU:0"

    def variables_device(self, variable_index=0):
        """Device for a shared variable.

        With parameter servers, variable `variable_index` (in creation order)
        goes round-robin to `/job:<ps_job_name>/task:k`, as TF-Slim's device
        chooser does.
        """
        if self._num_ps_tasks == 0:
            return "/device:CPU:0"
        _check_count("variable_index", variable_index, 0)
        task = variable_index % self._num_ps_tasks
        return f"{self._ps_device}/task:{task}/device:CPU:0"

    def check_devices(self):
        """Raises `ValueError` if a clone device does not exist here.

        This lists the logical devices, so it initialises the TensorFlow
        runtime; `CloneModel` calls it when `fit` starts.
        """
        available = _local_devices()
        missing = self._missing_clone_devices(available)
        if missing:
            i, device = missing[0]
            raise ValueError(
                f"Clone {i} is placed on {device!r}, which does not exist "
                f"on this machine. Available devices: "
                f"{', '.join(sorted(available))}. Pass `devices=[...]` "
                "with existing devices, or split a physical device into "
                "logical ones with "
                "`tf.config.set_logical_device_configuration` before "
                "TensorFlow starts."
            )
        if self._variable_update == "replicated":
            self.cross_device_ops()

    def on_existing_devices(self):
        """The deployment inference runs on here, and the devices missing.

        Where every clone device exists, this deployment itself; else one
        clone per clone device that exists, or one clone on the default
        device where none does. Inference reads the one copy of the
        variables, so the result keeps `variable_update`'s default.
        `CloneModel` calls it when `evaluate` or `predict` starts.

        Returns:
            `(deployment, missing)`: a `DeploymentConfig`, and the clone
            devices (strings) that do not exist here, in clone order.
        """
        missing = self._missing_clone_devices(_local_devices())
        if not missing:
            return self, []
        absent = {i for i, _ in missing}
        existing = [
            self.clone_device(i)
            for i in range(self._num_clones)
            if i not in absent
        ]
        deployment = DeploymentConfig(devices=existing or None)
        return deployment, [device for _, device in missing]

    def _missing_clone_devices(self, available):
        """`(clone index, device)` of the clone devices not in
        `available`."""
        missing = []
        for i in range(self._num_clones):
            device = self.clone_device(i)
            if not device:
                continue
            local = tf.DeviceSpec.from_string(device).replace(job=None)
            if local.to_string() not in available:
                missing.append((i, device))
        return missing

    def get_config(self):
        return {
            "num_clones": None if self._devices else self._num_clones,
            "clone_on_cpu": self._clone_on_cpu,
            "replica_id": self._replica_id,
            "num_replicas": self._num_replicas,
            "num_ps_tasks": self._num_ps_tasks,
            "worker_job_name": self._worker_job_name,
            "ps_job_name": self._ps_job_name,
            "devices": self.devices,
            "variable_update": self._variable_update,
            "all_reduce": self._all_reduce,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    @classmethod
    def of(cls, deployment):
        """`deployment` (a `CloneModel`'s argument) as a
        `DeploymentConfig`: one, or a dict of its arguments."""
        if isinstance(deployment, dict):
            return cls.from_config(deployment)
        if not isinstance(deployment, DeploymentConfig):
            raise TypeError(
                "`deployment` must be a `keras_clones.DeploymentConfig`. "
                f"Received: {deployment!r} of type {type(deployment).__name__}."
            )
        return deployment

    def __eq__(self, other):
        if not isinstance(other, DeploymentConfig):
            return NotImplemented
        return self.get_config() == other.get_config()

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"DeploymentConfig({args})"
