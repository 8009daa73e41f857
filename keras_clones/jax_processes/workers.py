"""The processes of a JAX run as workers: a mesh of (workers, devices),
a row per process of all its local devices (axes `worker_axis.NAME` and
`worker_axis.DEVICES`), and the programs that run on every process at
once.

A process's arrays take part in a program without a copy between
processes: an array of rank 1 or more as this process's block of a global
array (the blocks on axis 0, `P(NAME)`), copied on each of its devices; a
scalar as a replicated global array (`P()`) whose every process holds its
own value. Inside the program (`jax.shard_map` manual over the workers
only, its replication unchecked) each process sees its own arrays, laid
out over its devices by XLA (GSPMD: a step's batch is split over them,
`shard_rows`, so that a worker's step is one device's step on its whole
batch, its gradients reduced over the worker's devices); what the
program returns is unwrapped back into this process's own arrays.
"""

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from keras_clones.replicas import worker_axis


class Workers:
    """This run's processes, each a worker of all its local devices."""

    def __init__(self):
        self.count = jax.process_count()
        self.index = jax.process_index()
        self.devices = sorted(jax.local_devices(), key=lambda d: d.id)
        rows = {}
        for device in sorted(jax.devices(), key=lambda d: d.id):
            rows.setdefault(device.process_index, []).append(device)
        self.mesh = Mesh(
            np.array([rows[p] for p in range(self.count)]),
            (worker_axis.NAME, worker_axis.DEVICES),
        )
        self._broadcast = self.program(_from_chief, lambda specs: specs[0])
        self._gather = self.program(
            lambda values: [worker_axis.gather(values[0])],
            lambda specs: PartitionSpec(),
        )

    @property
    def is_chief(self):
        return self.index == 0

    def spec(self, value):
        """How a process's `value` is laid out in a global array (a
        global array: as it is)."""
        if _spans_processes(value):
            return value.sharding.spec
        if np.ndim(value) == 0:
            return PartitionSpec()
        return PartitionSpec(worker_axis.NAME)

    def wrap(self, value):
        """This process's array `value` as its part of a global one (a copy
        on each of its devices)."""
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

    def wrap_data(self, batch):
        """This process's rows of a batch (a structure of arrays) as its
        block of the global batch (whole on each of its devices: a step
        splits them, `shard_rows`, however many they are)."""
        sharding = NamedSharding(self.mesh, PartitionSpec(worker_axis.NAME))
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
        if len(self.devices) == 1:
            return batch
        rows = PartitionSpec(worker_axis.DEVICES)
        return jax.tree.map(
            lambda a: (
                jax.lax.with_sharding_constraint(a, rows) if np.ndim(a) else a
            ),
            batch,
        )

    def program(self, fn, out_specs, donate=()):
        """`fn` as a `Program` on every process (see `Program`)."""
        return Program(self, fn, out_specs, donate)

    def run(self, program, values):
        """`program` on `values` (structures of this process's arrays),
        its results unwrapped."""
        wrapped = jax.tree.map(self.wrap, tuple(values))
        return jax.tree.map(self.unwrap, program(*wrapped))

    # Small programs.

    def broadcast_from_chief(self, values):
        """`values` (a list of arrays) as process 0 holds them, on every
        process (exactly: the others add zeros)."""
        if not values:
            return []
        return self.run(self._broadcast, (list(values),))

    def gather(self, value):
        """Every process's `value`, a scalar or a vector of one length on
        every process, stacked in a NumPy array (a row per process)."""
        (gathered,) = self.run(self._gather, ([np.asarray(value)],))
        return np.asarray(gathered)

    def any(self, flag):
        """Whether `flag` (a bool) holds on any process."""
        return bool(np.any(self.gather(np.int32(bool(flag)))))


class Program:
    """`fn` compiled as one program on every process (`jax.shard_map`
    manual over the workers' axis, automatic over each worker's devices),
    for arguments laid out as their values are
    (`Workers.spec`), its results as `out_specs(in_specs)` (a structure of
    `PartitionSpec`s), the arguments at positions `donate` donated; traced
    once per layout of its arguments. Call it on global arrays."""

    def __init__(self, workers, fn, out_specs, donate=()):
        self._workers = workers
        self._fn = fn
        self._out_specs = out_specs
        self._donate = donate
        self._compiled = {}
        self._arguments = {}  # Each layout's arguments, abstract.

    def __call__(self, *args):
        workers = self._workers
        leaves, structure = jax.tree.flatten(args)
        layout = (structure, tuple(map(workers.spec, leaves)))
        compiled = self._compiled.get(layout)
        if compiled is None:
            specs = jax.tree.map(workers.spec, args)

            def traced(*args):
                with worker_axis.traced(workers.count):
                    return self._fn(*args)

            compiled = jax.jit(
                jax.shard_map(
                    traced,
                    mesh=workers.mesh,
                    in_specs=specs,
                    out_specs=self._out_specs(specs),
                    axis_names={worker_axis.NAME},
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


def _from_chief(values):
    import jax.numpy as jnp
    from jax import lax

    chief = lax.axis_index(worker_axis.NAME) == 0
    kept = []
    for value in values:
        as_int = value.dtype == jnp.bool_
        if as_int:
            value = value.astype(jnp.int32)
        kept.append(jnp.where(chief, value, jnp.zeros_like(value)))
    summed = worker_axis.total(kept)
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
