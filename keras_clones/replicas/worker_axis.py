"""The workers' axis of a step traced across JAX processes: the one place
where a traced step asks "am I one of several workers?" and reduces over
them. A worker is a group of devices along the mesh axis `NAME` (the
local devices of its processes, along `PROCESSES` and `DEVICES`, over
which XLA lays out its step).

`keras_clones.jax_trainer.train_function` traces Keras's own `train_step`
inside `jax.shard_map` over the workers' mesh
(`keras_clones.jax_processes.workers`), whose axis is `NAME`, and says so
with `traced(count)`. Inside, `workers()` is the number of workers, and
`mean`, `total` and `gather` reduce over them; everywhere else (one
process, TensorFlow, `keras.distribution`) `workers()` is None.

Each reduction sends one flat buffer per dtype: gloo pays several
milliseconds per operand of a tuple all-reduce.
"""

import contextlib

NAME = "workers"
# A worker's processes and each one's devices, the mesh's other axes.
PROCESSES = "processes"
DEVICES = "devices"
# How many consecutive JAX processes make one worker (default 1); the
# launcher's `--processes-per-worker` sets it (`keras_clones.launcher`
# imports no Keras: it spells it again).
PROCESSES_PER_WORKER = "KERAS_CLONES_PROCESSES_PER_WORKER"
_COUNTS = []  # The workers of the steps being traced, innermost last.


@contextlib.contextmanager
def traced(count):
    """While a step across `count` processes is traced, over `NAME`."""
    _COUNTS.append(count)
    try:
        yield
    finally:
        _COUNTS.pop()


def workers():
    """The number of workers the step being traced runs on, or None
    outside a step across workers."""
    return _COUNTS[-1] if _COUNTS else None


def workers_in_run():
    """The number of workers of this run (outside any step): its JAX
    processes, `processes_per_worker()` a worker."""
    import jax

    return jax.process_count() // processes_per_worker()


def processes_per_worker():
    """How many consecutive JAX processes make one worker
    (`PROCESSES_PER_WORKER`, 1 where it is not set), checked against this
    run's processes."""
    import os

    import jax

    said = os.environ.get(PROCESSES_PER_WORKER, "").strip()
    if not said:
        return 1
    try:
        count = int(said)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(
            f"{PROCESSES_PER_WORKER} must be a positive integer (the JAX "
            f"processes of one worker), but it is {said!r}. Set it to e.g. "
            "2, or unset it for a worker per process."
        )
    processes = jax.process_count()
    if processes % count:
        raise ValueError(
            f"{PROCESSES_PER_WORKER}={count} does not divide this run's "
            f"{processes} JAX processes into workers. Start a multiple of "
            f"{count} processes, or set it to a divisor of {processes}."
        )
    return count


def mean(values):
    """Each of `values` (arrays) averaged over the workers."""
    return _flat_per_dtype(values, lambda flat: _summed(flat) / workers())


def total(values, axes=NAME):
    """Each of `values` (arrays) summed over the workers (or over the mesh
    axes `axes`)."""
    return _flat_per_dtype(values, lambda flat: _summed(flat, axes))


def _summed(flat, axes=NAME):
    """`flat` summed over the workers (or `axes`). On CPU a 16-bit float is
    summed in float32 and rounded back, as XLA's CPU promotes it anyway
    (its pass fails on an all-reduce of a program manual over the workers
    only, "Invalid binary instruction opcode copy", jax 0.10.2)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    promoted = (
        jax.default_backend() == "cpu"
        and jnp.issubdtype(flat.dtype, jnp.floating)
        and flat.dtype.itemsize == 2
    )
    if promoted:
        return lax.psum(flat.astype(jnp.float32), axes).astype(flat.dtype)
    return lax.psum(flat, axes)


def gather(value):
    """`value` of every worker, stacked on a new first axis."""
    from jax import lax

    return lax.all_gather(value, NAME)


def quantized_reduction(integers, scales, dtype, reduce_op):
    """Each process's 8- or 4-bit commit (`quantization.encode`'s integers
    and scales) reduced (`"sum"` or `"mean"`) in the reduce-scatter form:
    each process sends each other its share of the blocks (one
    `all_to_all` of int8 bytes, the scales bitcast beside the integers),
    adds up the shares it owns in float32 in the processes' order,
    quantizes the result again, and every process gathers every owner's
    (one `all_gather`). Returns the flat float32 result, padding
    included."""
    import jax.numpy as jnp
    from jax import lax

    from keras_clones.agn import quantization

    count = workers()
    owned = -(-integers.shape[0] // count)  # Blocks a process owns.
    padding = [(0, owned * count - integers.shape[0]), (0, 0)]
    integers, scales = jnp.pad(integers, padding), jnp.pad(scales, padding)
    sent = _as_bytes(integers, scales, dtype)
    received = lax.all_to_all(sent.reshape(count, owned, -1), NAME, 0, 0)
    total = 0.0
    for process in range(count):
        total += quantization.decoded(*_from_bytes(received[process], dtype))
    if reduce_op == "mean":
        total = total / count
    blocks = total.reshape(owned, quantization.BLOCK)
    mine = _as_bytes(*quantization.encode_blocks(blocks, dtype), dtype)
    every = lax.all_gather(mine, NAME).reshape(count * owned, -1)
    return quantization.decoded(*_from_bytes(every, dtype))


def _as_bytes(integers, scales, dtype):
    """Blocks of integers and their scales as int8 bytes, a row a block:
    the integers as they travel (`quantization.as_bytes`), then the scale's
    four bytes."""
    import jax.numpy as jnp
    from jax import lax

    from keras_clones.agn import quantization

    values = lax.bitcast_convert_type(
        quantization.as_bytes(integers, dtype), jnp.int8
    )
    scale_bytes = lax.bitcast_convert_type(scales[:, 0], jnp.int8)
    return jnp.concatenate([values, scale_bytes], axis=1)


def _from_bytes(rows, dtype):
    """`_as_bytes`'s rows back as `(integers, scales)`."""
    import jax.numpy as jnp
    from jax import lax

    from keras_clones.agn import quantization

    values, scale_bytes = rows[:, :-4], rows[:, -4:]
    if dtype == "int4":
        values = lax.bitcast_convert_type(values, jnp.uint8)
    scales = lax.bitcast_convert_type(scale_bytes, jnp.float32)
    return quantization.from_bytes(values, dtype), scales[:, None]


def _flat_per_dtype(values, reduce):
    """`reduce` of each dtype's values concatenated flat, cut back."""
    import jax.numpy as jnp

    values = [jnp.asarray(v) for v in values]
    results = [None] * len(values)
    dtypes = []
    for v in values:
        if v.dtype not in dtypes:
            dtypes.append(v.dtype)
    for dtype in dtypes:
        indices = [i for i, v in enumerate(values) if v.dtype == dtype]
        flat = jnp.concatenate([jnp.ravel(values[i]) for i in indices])
        reduced = reduce(flat)
        offset = 0
        for i in indices:
            size = values[i].size
            piece = reduced[offset : offset + size]
            results[i] = jnp.reshape(piece, values[i].shape)
            offset += size
    return results
