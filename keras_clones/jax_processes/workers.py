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


class Workers:
    """This run's processes as workers: `processes` processes (this one
    `process`), `count` workers of `per_worker` consecutive processes each
    (this one's `index`), a worker all its processes' local devices."""

    def __init__(self):
        self.processes = jax.process_count()
        self.process = jax.process_index()
        self.per_worker = worker_axis.processes_per_worker()
        self.count = self.processes // self.per_worker
        self.index = self.process // self.per_worker
        self.devices = sorted(jax.local_devices(), key=lambda d: d.id)
        self.mesh = _mesh(self.count, self.per_worker)
        self._broadcast = self.program(
            _from_chief, lambda specs: specs[0], _PROCESS_AXES
        )
        self._gather = self.program(
            lambda values: [jax.lax.all_gather(values[0], _PROCESS_AXES)],
            lambda specs: PartitionSpec(),
            _PROCESS_AXES,
        )

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
        global array: as it is)."""
        if _spans_processes(value):
            return value.sharding.spec
        if np.ndim(value) == 0:
            return PartitionSpec()
        return PartitionSpec(worker_axis.NAME)

    def wrap(self, value):
        """This process's array `value` as its worker's part of a global
        one (a copy on each of its devices; its worker's other processes
        hold the same)."""
        copies = [jax.device_put(value, d) for d in self.devices]
        shape = tuple(copies[0].shape)
        if shape:
            shape = (shape[0] * self.count, *shape[1:])
        sharding = NamedSharding(self.mesh, self.spec(copies[0]))
        return jax.make_array_from_single_device_arrays(shape, sharding, copies)

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
        rows = PartitionSpec(*[None] * axis, _PROCESS_AXES)
        sharding = NamedSharding(self.mesh, rows)
        return jax.tree.map(
            lambda rows: jax.make_array_from_process_local_data(
                sharding, np.asarray(rows) if _host(rows) else rows
            ),
            batch,
        )

    def unwrap(self, value):
        """This process's own array of a global array `value` (its first
        device's copy; else `value`, with one process the same)."""
        if not _spans_processes(value):
            return value  # One process's (with one, as global).
        return value.addressable_data(0)

    def shard_rows(self, batch):
        """Inside a program: this worker's batch (a structure of arrays)
        split by rows over its devices (unevenly where they do not divide:
        XLA pads inside)."""
        if self.per_worker == 1 and len(self.devices) == 1:
            return batch
        rows = PartitionSpec((worker_axis.PROCESSES, worker_axis.DEVICES))
        return jax.tree.map(
            lambda a: (
                jax.lax.with_sharding_constraint(a, rows) if np.ndim(a) else a
            ),
            batch,
        )

    def program(self, fn, out_specs, axes=(worker_axis.NAME,), donate=()):
        """`fn` as a `Program` on every process (see `Program`)."""
        return Program(self, fn, out_specs, axes, donate)

    def run(self, program, values):
        """`program` on `values` (structures of this process's arrays),
        its results unwrapped."""
        wrap = self.wrap
        if program.axes == _PROCESS_AXES:  # Each process's own value.
            wrap = self._wrap_own
        wrapped = jax.tree.map(wrap, tuple(values))
        return jax.tree.map(self.unwrap, program(*wrapped))

    def _wrap_own(self, value):
        """This process's array `value` as its block of a global array,
        one a process (a scalar: of shape (1,))."""
        value = np.asarray(value)
        if not value.ndim:
            value = value[None]
        sharding = NamedSharding(self.mesh, PartitionSpec(_PROCESS_AXES))
        return jax.make_array_from_process_local_data(sharding, value)

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
    donated; traced once per layout of its arguments. Call it on global
    arrays."""

    def __init__(self, workers, fn, out_specs, axes, donate=()):
        self._workers = workers
        self._fn = fn
        self._out_specs = out_specs
        self.axes = tuple(axes)
        self._donate = donate
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

            def traced(*args):
                with worker_axis.traced(workers.count):
                    return self._fn(*args)

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


def _mesh(workers, per_worker):
    """The mesh of `workers` workers of `per_worker` processes each, in
    the processes' order, each process's devices in their order."""
    rows = {}
    for device in sorted(jax.devices(), key=lambda d: d.id):
        rows.setdefault(device.process_index, []).append(device)
    counts = sorted({len(devices) for devices in rows.values()})
    if len(counts) > 1:
        raise ValueError(
            "Across JAX processes every process must have as many local "
            "devices, as a worker is laid out over a mesh, but they have "
            f"{[len(rows[p]) for p in sorted(rows)]} (by process). Give each "
            "process as many devices (e.g. `CUDA_VISIBLE_DEVICES`)."
        )
    devices = np.array([rows[p] for p in sorted(rows)])
    return Mesh(
        devices.reshape(workers, per_worker, counts[0]),
        (worker_axis.NAME, worker_axis.PROCESSES, worker_axis.DEVICES),
    )


def _manual(spec, axes):
    """`spec` as `jax.shard_map` takes it, over the manual mesh axes
    `axes`: the others left out (automatic, XLA keeps the layout)."""

    def kept(entry):
        names = entry if isinstance(entry, tuple) else (entry,)
        names = tuple(n for n in names if n in axes)
        if not names:
            return None
        return names[0] if len(names) == 1 else names

    return PartitionSpec(*map(kept, spec))


def _from_chief(values):
    import jax.numpy as jnp
    from jax import lax

    chief = lax.axis_index(_PROCESS_AXES) == 0
    kept = []
    for value in values:
        as_int = value.dtype == jnp.bool_
        if as_int:
            value = value.astype(jnp.int32)
        kept.append(jnp.where(chief, value, jnp.zeros_like(value)))
    summed = worker_axis.total(kept, _PROCESS_AXES)
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
