"""Accumulated Gradient Normalization by hand, in NumPy: the one reference
the AGN tests compare against, in one process, across workers and under
parameter servers.

Weights are one flat vector (`flat`, `unflat` convert a list of arrays).
At each step every worker takes a local step with its own inner optimizer
and accumulates its gradient. Fragment f of F (the flat weights cut at
equal shares) ends its period at steps (f + 1) * period / F of each period:
every worker commits its part (the accumulated gradients, or with
`commit="weight_change"` how far its weights moved since the part's last
commit), divided by the period unless `normalize=False`; the mean over
workers (summed in 16 bits with `communication_dtype` "bfloat16" or
"float16") moves the part's centers by the fragment's own outer
optimizer, and the workers' parts take the centers. In "int8" or "int4"
each worker's part arrives quantized (`quantized`), with error feedback
its last residual added first. With `overlap`, a commit moves the
centers a period late, at the fragment's next commit; each worker's part
then mixes (`mixing` of its own) with where the centers will be once the
commit in flight arrives, were it the worker's own (its outer step, by a
copy of the outer optimizer); the end of training applies the commits in
flight and mixes the parts with the centers. Plain AGN is one fragment
without overlap.
"""

import copy
import dataclasses

import ml_dtypes
import numpy as np


def flat(arrays):
    return np.concatenate([np.ravel(a) for a in arrays])


def unflat(vector, like):
    """`vector` cut into arrays of the shapes of `like`."""
    arrays, offset = [], 0
    for a in like:
        size = np.size(a)
        arrays.append(np.reshape(vector[offset : offset + size], np.shape(a)))
        offset += size
    return arrays


SIXTEEN_BITS = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def rounded(value, dtype):
    """`value` rounded to `dtype` ("bfloat16" or "float16"; to nearest,
    ties to even, from float32 as TensorFlow casts), as float64."""
    value = np.asarray(value, "float32")
    return value.astype(SIXTEEN_BITS[dtype]).astype("float64")


def bfloat16(value):
    return rounded(value, "bfloat16")


QUANTIZED = {"int8": 127, "int4": 7}  # The largest integer each sends.
BLOCK = 128  # Numbers per float32 scale.


def quantized(value, dtype):
    """A flat commit as it arrives in `dtype` ("int8" or "int4"): per block
    of `BLOCK` numbers, in float32, with m its largest magnitude and q the
    largest integer, each number times q / m rounded to nearest (an exact
    half to even) and clipped to [-q, q], times the scale m * (1 / q); as
    float64. Multiplies, as the library writes them: a division by the
    scale (or by q) is not what XLA computes, and a half lands apart."""
    value = np.asarray(value, "float32")
    levels = np.float32(QUANTIZED[dtype])
    arrived = np.zeros_like(value)
    for first in range(0, value.size, BLOCK):
        block = value[first : first + BLOCK]
        largest = np.max(np.abs(block))
        if largest > 0:
            with np.errstate(over="ignore"):  # Kept finite, as the library.
                per_unit = min(levels / largest, np.finfo("float32").max)
            integers = np.clip(np.round(block * per_unit), -levels, levels)
            scale = largest * (np.float32(1) / levels)
            arrived[first : first + BLOCK] = integers * scale
    return arrived.astype("float64")


@dataclasses.dataclass
class Trajectory:
    """What the workers held: after each step (`history`, a list of
    (each worker's local weights, centers)), and at the end, the commits
    in flight applied (`local`, `center`); `rounds`, the commits sent."""

    history: list
    local: list
    center: np.ndarray
    rounds: int


def steps_table(grads):
    """`agn`'s `gradient` from a table: `grads[step]`, on every worker."""
    return lambda worker, step, weights: grads[step]


def ends_at(step, period, fragments):
    """The fragments whose period ends at `step` (counted from 1)."""
    return [
        f
        for f in range(fragments)
        if step % period == (f + 1) * period // fragments % period
    ]


def mean_commit(sent, communication_dtype):
    """The mean over workers of their commits, as the all-reduce sums it
    (in 16 bits: each worker's share rounded, then the sum)."""
    workers = len(sent)
    if communication_dtype in SIXTEEN_BITS:
        shares = [rounded(s / workers, communication_dtype) for s in sent]
        return rounded(sum(shares), communication_dtype)
    return sum(sent) / workers


def agn(
    start,
    gradient,
    steps,
    period,
    inner,
    outer=None,
    *,
    workers=1,
    commit="gradients",
    normalize=True,
    communication_dtype=None,
    error_feedback=None,
    requantized=False,
    fragments=1,
    overlap=False,
    mixing=0.5,
    skipped=(),
    reads=None,
    per_read=1,
    resize=None,
):
    """AGN for `steps` steps from the flat weights `start`.

    Args:
        gradient: `gradient(worker, step, weights)`, the gradient worker
            `worker` takes at step `step` (from 0) at its flat `weights`.
        inner: makes an inner optimizer (`step(w, g)`), one per worker.
        outer: makes an outer optimizer, one per fragment; by default
            `inner`.
        error_feedback: with `communication_dtype` "int8" or "int4", each
            worker adds to its commit what quantization dropped from its
            last one; None: with "int4" only.
        requantized: with "int8" or "int4", the workers' mean quantized
            again before it moves the centers, as its owner does in JAX's
            reduce-scatter form (across processes).
        skipped: (worker, step) pairs that take no local step and
            accumulate nothing, yet count toward the period.
        reads: under parameter servers (one worker, one fragment, no
            overlap), how many commits the centers had taken when each
            scheduled function of `per_read` periods read them.
        per_read: with `reads`, periods per scheduled function. Its first
            period starts from the centers read; each later one from where
            its worker's own commits moved them, by a copy of the outer
            optimizer as it stood at the read.
        resize: `(step, workers)`: from step `step` (from 0) on `workers`
            workers, as a resume on another number of workers defines it:
            the first workers keep their state; a new one starts from the
            centers, with the first worker's inner optimizer; what a
            worker that left did since its last commit is dropped; the
            commit in flight is kept.

    Returns:
        A `Trajectory`.
    """
    start = np.asarray(start, "float64")
    outer = outer or inner
    if error_feedback is None:
        error_feedback = communication_dtype == "int4"
    bounds = [round(start.size * f / fragments) for f in range(fragments + 1)]
    parts = [slice(bounds[f], bounds[f + 1]) for f in range(fragments)]
    inners = [inner() for _ in range(workers)]
    outers = [outer() for _ in range(fragments)]
    local = [start.copy() for _ in range(workers)]
    begun = [start.copy() for _ in range(workers)]
    accumulated = [np.zeros_like(start) for _ in range(workers)]
    residual = [np.zeros_like(start) for _ in range(workers)]
    center = start.copy()
    in_flight = [None] * fragments
    history, rounds = [], 0
    if reads is not None and (workers, fragments, overlap) != (1, 1, False):
        raise ValueError("`reads`: one worker, one fragment, no overlap.")
    after = [center.copy()]  # The centers after each commit.
    outer_after = [copy.deepcopy(outers[0])]  # The outer optimizer then.
    own_outer = copy.deepcopy(outers[0])  # With `reads`: a worker's copy.

    def apply(f, mean, mixing):
        part = parts[f]
        center[part] = outers[f].step(center[part], mean)
        for w in local:
            w[part] = mixing * w[part] + (1 - mixing) * center[part]

    for step in range(steps):
        if resize is not None and step == resize[0]:
            workers, kept = resize[1], min(resize[1], workers)
            new = range(workers - kept)
            inners = inners[:kept] + [copy.deepcopy(inners[0]) for _ in new]
            local = local[:kept] + [center.copy() for _ in new]
            begun = begun[:kept] + [center.copy() for _ in new]
            accumulated = accumulated[:kept] + [
                np.zeros_like(start) for _ in new
            ]
            residual = residual[:kept] + [np.zeros_like(start) for _ in new]
        for w in range(workers):
            if (w, step) in skipped:
                continue
            g = np.asarray(gradient(w, step, local[w].copy()), "float64")
            local[w] = inners[w].step(local[w], g)
            accumulated[w] = accumulated[w] + g
        for f in ends_at(step + 1, period, fragments):
            part = parts[f]
            if commit == "gradients":
                sent = [a[part] for a in accumulated]
            else:  # How far each worker's part moved since its last commit.
                sent = [b[part] - w[part] for b, w in zip(begun, local)]
            if normalize:
                sent = [s / period for s in sent]
            own = sent  # Each worker's commit as it leaves (with overlap).
            if communication_dtype in QUANTIZED:
                if error_feedback:
                    sent = [s + r[part] for s, r in zip(sent, residual)]
                own = sent
                arrived = [quantized(s, communication_dtype) for s in sent]
                if error_feedback:
                    for r, s, a in zip(residual, sent, arrived):
                        r[part] = s - a
                sent = arrived
            mean = mean_commit(sent, communication_dtype)
            if requantized and communication_dtype in QUANTIZED:
                mean = quantized(mean, communication_dtype)
            rounds += 1
            for a in accumulated:
                a[part] = 0.0
            if not overlap:
                apply(f, mean, mixing=0.0)
                after.append(center.copy())
                outer_after.append(copy.deepcopy(outers[0]))
                call, within = divmod(rounds, per_read)
                if reads is not None and within:  # Its own commits moved it.
                    local[0] = own_outer.step(begun[0], mean)
                elif reads is not None and call < len(reads):
                    local[0] = after[reads[call]].copy()
                    own_outer = copy.deepcopy(outer_after[reads[call]])
            else:
                if in_flight[f] is not None:
                    center[part] = outers[f].step(center[part], in_flight[f])
                for w, s in zip(local, own):  # Where the centers will be,
                    # were the commit in flight this worker's own.
                    ahead = copy.deepcopy(outers[f]).step(center[part], s)
                    w[part] = mixing * w[part] + (1 - mixing) * ahead
                in_flight[f] = mean
            for b, w in zip(begun, local):
                b[part] = w[part]
        history.append(([w.copy() for w in local], center.copy()))
    for f, mean in enumerate(in_flight):
        if mean is not None:
            apply(f, mean, mixing)
    return Trajectory(history, local, center, rounds)
