"""The workers' axis of a step traced across JAX processes: the one place
where a traced step asks "am I one of several processes?" and reduces
over them.

`keras_clones.jax_processes` traces Keras's own `train_step` inside
`jax.shard_map` over a one-dimensional mesh of one device per process,
whose axis is `NAME`, and says so with `traced(count)`. Inside,
`workers()` is the number of processes, and `mean`, `total` and `gather`
reduce over them; everywhere else (one process, TensorFlow,
`keras.distribution`) `workers()` is None.

Each reduction sends one flat buffer per dtype: gloo pays several
milliseconds per operand of a tuple all-reduce.
"""

import contextlib

NAME = "workers"
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
    """The number of processes the step being traced runs on, or None
    outside a step across processes."""
    return _COUNTS[-1] if _COUNTS else None


def processes():
    """The number of JAX processes of this run (outside any step)."""
    import jax

    return jax.process_count()


def mean(values):
    """Each of `values` (arrays) averaged over the processes."""
    from jax import lax

    return _flat_per_dtype(values, lambda flat: lax.pmean(flat, NAME))


def total(values):
    """Each of `values` (arrays) summed over the processes."""
    from jax import lax

    return _flat_per_dtype(values, lambda flat: lax.psum(flat, NAME))


def gather(value):
    """`value` of every process, stacked on a new first axis."""
    from jax import lax

    return lax.all_gather(value, NAME)


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
