"""The processes of a JAX run as workers: a mesh of (workers, processes,
devices) (axes `worker_axis.NAME`, `worker_axis.PROCESSES` and
`worker_axis.DEVICES`), a worker `worker_axis.processes_per_worker()`
consecutive processes of all their local devices, and the programs that
run on every process at once.

A process's arrays take part in a program without a copy between
processes: a state array of rank 1 or more as its worker's block of a
global array (the blocks on axis 0, `P(NAME)`), copied on each of the
process's devices (the processes of a worker hold the same state); a
scalar as a replicated global array (`P()`) whose every process holds its
own value; a batch as this process's rows of its worker's batch (the
processes' rows in their order). Inside a step's program (`jax.shard_map`
manual over the workers only, its replication unchecked) each worker sees
its own arrays, laid out over its devices by XLA (GSPMD: a step's batch is
split over them, `shard_rows`, so that a worker's step is one device's
step on its whole batch, its gradients reduced over the worker's
devices); what the program returns is unwrapped back into this process's
own arrays. The small programs (`gather`, `broadcast_from_chief`) are
manual over the processes: each process's value is its own.
"""

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from keras_clones.replicas import worker_axis

# The mesh axes that tell processes apart.
_PROCESS_AXES = (worker_axis.NAME, worker_axis.PROCESSES)


def worker_devices():
    """This worker's devices by Keras's names (`"gpu:0"`, `"cpu:2048"`),
    in order: what a `keras.distribution.DeviceMesh` inside the worker
    takes (`devices=`) across JAX processes."""
    per_worker = worker_axis.processes_per_worker()
    first = jax.process_index() // per_worker * per_worker
    rows = _devices_by_process()
    return [
        f"{d.platform}:{d.id}"
        for process in range(first, first + per_worker)
        for d in rows[process]
    ]


class Workers:
    """This run's processes as workers: `processes` processes (this one
    `process`), `count` workers of `per_worker` consecutive processes each
    (this one's `index`), a worker all its processes' local devices, or
    those of `devices` (this process's, e.g. a `CloneModel`'s clones;
    every process's at the same places among its own); under a
    `keras.distribution` over this worker's devices (`distribution`, see
    `check_within_worker`), each worker's devices laid out as its mesh,
    which governs the step within the worker."""

    def __init__(self, distribution=None, devices=None):
        self.processes = jax.process_count()
        self.process = jax.process_index()
        self.per_worker = worker_axis.processes_per_worker()
        self.count = self.processes // self.per_worker
        self.index = self.process // self.per_worker
        local = sorted(jax.local_devices(), key=_id)
        self.places = tuple(
            range(len(local))
            if devices is None
            else sorted(local.index(d) for d in devices)
        )
        self.devices = [local[place] for place in self.places]
        self.distribution = distribution
        if distribution is None:
            self.mesh = _mesh(self.count, self.per_worker, self.places)
            self._own_mesh = None
            self._rows = (worker_axis.PROCESSES, worker_axis.DEVICES)
            self._process_axes = _PROCESS_AXES
        else:
            self._own_mesh = distribution.device_mesh.backend_mesh
            self.mesh = _mesh_of_workers(self._own_mesh, self.count)
            self._rows = (distribution.batch_dim_name,)
            self._process_axes = (worker_axis.NAME,)
        axes = self._process_axes
        self._broadcast = Program(
            self,
            lambda values: _from_chief(values, axes),
            _first,
            axes,
            per_process=True,
        )
        self._gather = Program(
            self,
            lambda values: [jax.lax.all_gather(values[0], axes)],
            lambda specs: PartitionSpec(),
            axes,
            per_process=True,
        )

    def of_devices(self, devices):
        """Whether a worker takes `devices` of this process (None: all of
        its devices)."""
        return self.devices == sorted(devices or jax.local_devices(), key=_id)

    @property
    def is_chief(self):
        return self.process == 0

    @property
    def leads_worker(self):
        """Whether this process is its worker's first (which writes what
        the worker's processes hold alike)."""
        return self.process % self.per_worker == 0

    def spec(self, value):
        """How a process's `value` is laid out in a global array (a
        global array: as it is): its worker's block on axis 0, laid out
        within the worker as `value` is over its mesh."""
        if _spans_processes(value):
            return value.sharding.spec
        if np.ndim(value) == 0:
            return PartitionSpec()
        return _joined(self._own_spec(value), 0)

    def _own_spec(self, value):
        """How `value` is split over this worker's mesh (a
        `keras.distribution`'s), or None (whole on each device)."""
        sharding = getattr(value, "sharding", None)
        if (
            self._own_mesh is None
            or not isinstance(sharding, NamedSharding)
            or sharding.mesh != self._own_mesh
            or not any(sharding.spec)
        ):
            return None
        return sharding.spec

    def wrap(self, value):
        """This process's array `value` as its worker's part of a global
        one (its shards on the devices they are on, or else a copy on each
        of its devices; its worker's other processes hold the same)."""
        if self._own_spec(value) is not None:
            parts = [shard.data for shard in value.addressable_shards]
        else:
            parts = [jax.device_put(value, d) for d in self.devices]
        shape = tuple(value.shape)
        if shape:
            shape = (shape[0] * self.count, *shape[1:])
        sharding = NamedSharding(self.mesh, self.spec(value))
        return jax.make_array_from_single_device_arrays(shape, sharding, parts)

    def wrapped(self, value):
        """`value` as a global array: wrapped (`wrap`), unless it is one
        already."""
        if _spans_processes(value):
            return value
        return self.wrap(value)

    def wrap_data(self, batch, axis=0):
        """This process's rows (along `axis`) of a batch (a structure of
        arrays) as its part of its worker's (whole on each of its devices:
        a step splits the worker's, `shard_rows`, however many they are)."""
        return jax.tree.map(lambda rows: self._wrap_rows(rows, axis), batch)

    def _wrap_rows(self, rows, axis):
        own = self._own_spec(rows)
        if own is not None:  # As Keras laid it out over the worker's mesh.
            shape = list(rows.shape)
            shape[axis] *= self.count
            sharding = NamedSharding(self.mesh, _joined(own, axis))
            return jax.make_array_from_single_device_arrays(
                tuple(shape),
                sharding,
                [shard.data for shard in rows.addressable_shards],
            )
        spec = PartitionSpec(*[None] * axis, self._process_axes)
        return jax.make_array_from_process_local_data(
            NamedSharding(self.mesh, spec),
            np.asarray(rows) if _host(rows) else rows,
        )

    def unwrap(self, value):
        """This process's own array of a global array `value` (its first
        device's copy; else `value`, with one process the same)."""
        if not _spans_processes(value):
            return value  # One process's (with one, as global).
        own = _without_workers(value.sharding.spec)
        if self._own_mesh is None or not any(own):
            return value.addressable_data(0)
        shape = (value.shape[0] // self.count, *value.shape[1:])
        return jax.make_array_from_single_device_arrays(
            shape,
            NamedSharding(self._own_mesh, own),
            [shard.data for shard in value.addressable_shards],
        )

    def shard_rows(self, batch):
        """Inside a program: this worker's batch (a structure of arrays)
        split by rows over its devices (unevenly where they do not divide:
        XLA pads inside)."""
        if self.per_worker == 1 and len(self.devices) == 1:
            return batch
        rows = PartitionSpec(self._rows)
        return jax.tree.map(
            lambda a: (
                jax.lax.with_sharding_constraint(a, rows) if np.ndim(a) else a
            ),
            batch,
        )

    def program(self, fn, out_specs, donate=(), keeps_layout=False):
        """`fn` as a `Program` on every process, manual over the workers
        (see `Program`)."""
        return Program(
            self, fn, out_specs, (worker_axis.NAME,), donate, keeps_layout
        )

    def run(self, program, values):
        """`program` on `values` (structures of this process's arrays),
        its results unwrapped."""
        wrap = self.wrap
        if program.per_process:  # Each process's own value.
            wrap = self._wrap_own
        wrapped = jax.tree.map(wrap, tuple(values))
        return jax.tree.map(self.unwrap, program(*wrapped))

    def _wrap_own(self, value):
        """This process's array `value` as its block of a global array,
        one a process (a scalar: of shape (1,))."""
        value = np.asarray(value)
        if not value.ndim:
            value = value[None]
        spec = PartitionSpec(self._process_axes)
        return jax.make_array_from_process_local_data(
            NamedSharding(self.mesh, spec), value
        )

    # Small programs.

    def broadcast_from_chief(self, values):
        """`values` (a list of arrays) as process 0 holds them, on every
        process (exactly: the others add zeros)."""
        if not values:
            return []
        results = self.run(self._broadcast, (list(values),))
        return [r.reshape(np.shape(v)) for r, v in zip(results, values)]

    def gather(self, value):
        """Every process's `value`, a scalar or a vector of one length on
        every process, stacked in a NumPy array (a row per process)."""
        (gathered,) = self.run(self._gather, ([np.asarray(value)],))
        return np.asarray(gathered).reshape(self.processes, *np.shape(value))

    def any(self, flag):
        """Whether `flag` (a bool) holds on any process."""
        return bool(np.any(self.gather(np.int32(bool(flag)))))


class Program:
    """`fn` compiled as one program on every process (`jax.shard_map`
    manual over the mesh axes `axes`, by default the workers' axis, and
    automatic over each worker's devices), for arguments laid out as their
    values are (`Workers.spec`), its results as `out_specs(in_specs)` (a
    structure of `PartitionSpec`s), the arguments at positions `donate`
    donated, and, where it `keeps_layout`, its second result laid out
    within each worker as its first argument is (a step's state); traced
    once per layout of its arguments. Call it on global arrays; one
    `per_process` (manual over the processes) on each process's own
    (`Workers.run` wraps them so)."""

    def __init__(
        self,
        workers,
        fn,
        out_specs,
        axes,
        donate=(),
        keeps_layout=False,
        per_process=False,
    ):
        self._workers = workers
        self._fn = fn
        self._out_specs = out_specs
        self.axes = tuple(axes)
        self.per_process = per_process
        self._donate = donate
        self._keeps_layout = keeps_layout
        self._compiled = {}
        self._arguments = {}  # Each layout's arguments, abstract.

    def __call__(self, *args):
        workers = self._workers
        leaves, structure = jax.tree.flatten(args)
        layout = (structure, tuple(map(workers.spec, leaves)))
        compiled = self._compiled.get(layout)
        if compiled is None:
            specs = jax.tree.map(
                lambda a: _manual(workers.spec(a), self.axes), args
            )

            kept = self._keeps_layout and jax.tree.map(
                lambda a: _without_workers(workers.spec(a)), args[0]
            )

            def traced(*args):
                with worker_axis.traced(workers.count):
                    results = self._fn(*args)
                if not self._keeps_layout:
                    return results
                first, second, *rest = results
                second = jax.tree.map(_constrained, second, kept)
                return (first, second, *rest)

            compiled = jax.jit(
                jax.shard_map(
                    traced,
                    mesh=workers.mesh,
                    in_specs=specs,
                    out_specs=self._out_specs(specs),
                    axis_names=set(self.axes),
                    check_vma=False,
                ),
                donate_argnums=self._donate,
            )
            self._compiled[layout] = compiled
            self._arguments[layout] = jax.tree.map(_abstract, args)
        return compiled(*args)

    def compiled_texts(self):
        """The text of each program compiled so far, one per layout, at the
        shapes of its first call (XLA's HLO, after optimisation), for a
        look at its collectives."""
        return [
            compiled.lower(*self._arguments[layout]).compile().as_text()
            for layout, compiled in self._compiled.items()
        ]


def _mesh(workers, per_worker, places):
    """The mesh of `workers` workers of `per_worker` processes each, in
    the processes' order, each process's devices at `places` (among its
    own, in their order)."""
    rows = _devices_by_process()
    counts = sorted({len(devices) for devices in rows.values()})
    if len(counts) > 1:
        raise ValueError(
            "Across JAX processes every process must have as many local "
            "devices, as a worker is laid out over a mesh, but they have "
            f"{[len(rows[p]) for p in sorted(rows)]} (by process). Give each "
            "process as many devices (e.g. `CUDA_VISIBLE_DEVICES`)."
        )
    devices = np.array([rows[p] for p in sorted(rows)])[:, list(places)]
    return Mesh(
        devices.reshape(workers, per_worker, len(places)),
        (worker_axis.NAME, worker_axis.PROCESSES, worker_axis.DEVICES),
    )


def _mesh_of_workers(own, workers):
    """The mesh of `workers` workers, each laid out as this one's mesh
    `own` (a `keras.distribution`'s, over this process's devices): its
    axes after `worker_axis.NAME`, each worker's devices where this
    worker's of the same rank (by id) are."""
    ranks = {d: r for r, d in enumerate(sorted(own.devices.flat, key=_id))}
    rows = _devices_by_process()
    places = np.vectorize(ranks.get, otypes=[int])(own.devices)
    devices = np.stack([np.array(rows[p])[places] for p in sorted(rows)])
    return Mesh(devices, (worker_axis.NAME, *own.axis_names))


def _devices_by_process():
    """`{process index: its devices, in order}` of every process."""
    rows = {}
    for device in sorted(jax.devices(), key=_id):
        rows.setdefault(device.process_index, []).append(device)
    return rows


def _id(device):
    return device.id


def _joined(own, axis):
    """A worker's layout `own` (a `PartitionSpec` over its mesh, or None)
    with the workers' axis joined at dimension `axis`, outermost."""
    entries = list(own or ())
    entries += [None] * (axis + 1 - len(entries))
    inner = entries[axis]
    inner = () if inner is None else inner
    inner = inner if isinstance(inner, tuple) else (inner,)
    joined = (worker_axis.NAME, *inner)
    entries[axis] = joined if len(joined) > 1 else joined[0]
    return PartitionSpec(*entries)


def _without_workers(spec):
    """`spec` without the workers' axis: the layout within a worker."""
    return _kept(spec, lambda name: name != worker_axis.NAME)


def _manual(spec, axes):
    """`spec` as `jax.shard_map` takes it, over the manual mesh axes
    `axes`: the others left out (automatic, XLA keeps the layout)."""
    return _kept(spec, lambda name: name in axes)


def _kept(spec, keeps):
    """`spec` with the mesh axes that `keeps` (a predicate) only."""

    def kept(entry):
        names = entry if isinstance(entry, tuple) else (entry,)
        names = tuple(n for n in names if n is not None and keeps(n))
        if not names:
            return None
        return names[0] if len(names) == 1 else names

    return PartitionSpec(*map(kept, spec))


def _constrained(value, spec):
    """Inside a program: `value` laid out within its worker as `spec`
    says (a scalar, or a `spec` that splits nothing: as it is)."""
    if not np.ndim(value) or not any(spec):
        return value
    return jax.lax.with_sharding_constraint(value, spec)


def _first(specs):
    return specs[0]


def _from_chief(values, axes):
    """`values` of process 0, in a program manual over the processes'
    `axes`."""
    import jax.numpy as jnp
    from jax import lax

    chief = lax.axis_index(axes) == 0
    kept = []
    for value in values:
        as_int = value.dtype == jnp.bool_
        if as_int:
            value = value.astype(jnp.int32)
        kept.append(jnp.where(chief, value, jnp.zeros_like(value)))
    summed = worker_axis.total(kept, axes)
    return [
        s.astype(jnp.bool_) if v.dtype == jnp.bool_ else s
        for s, v in zip(summed, values)
    ]


def _spans_processes(value):
    return isinstance(value, jax.Array) and not value.is_fully_addressable


def _abstract(value):
    return jax.ShapeDtypeStruct(
        value.shape, value.dtype, sharding=value.sharding
    )


def _host(rows):
    return not isinstance(rows, jax.Array)
