"""One step's clones: the batch cut into one slice per clone, each clone's
forward pass, loss and (in training) gradients on its device and in its
name scope, and their gradients summed.

TF-Slim's `model_deploy` for a Keras model: a clone's loss counts by its
share of the batch, so that N clones give the loss and gradients of one
device on the whole batch; empty clones (a batch smaller than the number of
clones) contribute exactly nothing.
"""

import contextlib
import typing
import warnings

import keras
import tensorflow as tf

from keras_clones import _keras_internals as internals
from keras_clones.clone_model.computed_step import ComputedStep

# Reductions that divide by the number of elements: a clone's loss counts in
# proportion to its share of the batch. "sum" adds the clones' losses.
_SHARE_REDUCTIONS = ("sum_over_batch_size", "mean")
_SUM_REDUCTIONS = ("sum",)


class CloneBatch(typing.NamedTuple):
    """One clone's part of a batch."""

    data: object  # The clone's slice, or one placeholder row if it is empty.
    size: tf.Tensor  # Rows of the batch the clone owns (int32, may be 0).
    share: tf.Tensor  # size / batch size (float32).
    present: tf.Tensor  # 1.0 if the clone owns rows, else 0.0.


class Batch(typing.NamedTuple):
    """A batch and its slices (`split`)."""

    data: tuple  # `(x, y, sample_weight)`.
    size: tf.Tensor  # Rows of the batch (int32).
    clones: list  # One `CloneBatch` per clone.


class ClonesRun(typing.NamedTuple):
    """What running the clones gives (`run`)."""

    contributions: list  # Each clone's share of the batch loss.
    losses: list  # Each clone's loss on its slice (`clone_i_loss`).
    sizes: list  # Each clone's rows.
    y_preds: list  # Each clone's predictions on its slice.
    grads: list  # In training, each clone's gradients.


class CloneLosses:
    """Each clone's loss on its slice: `clone_i_loss` in `fit`'s logs.

    Means over the batches since the last reset, weighted by the clone's
    rows, as Keras's loss tracker. They are not model metrics, so that
    `evaluate`, `metrics_names` and `model.metrics` are a plain model's.
    """

    def __init__(self, num_clones):
        self.trackers = [
            keras.metrics.Mean(name=f"clone_{i}_loss")
            for i in range(num_clones if num_clones > 1 else 0)
        ]

    def update(self, i, loss, rows):
        if self.trackers:
            self.trackers[i].update_state(loss, sample_weight=rows)

    def reset(self):
        for tracker in self.trackers:
            tracker.reset_state()

    def results(self):
        return {tracker.name: tracker.result() for tracker in self.trackers}


def split(data, deployment):
    """One slice of a batch (`(x, y, sample_weight)` or as Keras packs it)
    per clone of `deployment`, as `np.array_split`, on its inputs device.

    An empty clone (batch smaller than the number of clones) gets the first
    row with zero weight, so its loss and gradients are exactly zero rather
    than the NaN an empty batch gives some layers (BatchNormalization).
    """
    data = keras.utils.unpack_x_y_sample_weight(data)
    with tf.device(deployment.inputs_device()):
        size = _batch_size(data[0])
        return Batch(data, size, _slices(data, size, deployment.num_clones))


def _slices(data, batch_size, num_clones):
    base = batch_size // num_clones
    remainder = batch_size % num_clones
    total = tf.cast(batch_size, "float32")
    clone_batches = []
    for i in range(num_clones):
        size = base + tf.cast(i < remainder, batch_size.dtype)
        start = i * base + tf.minimum(i, remainder)
        start = tf.where(size > 0, start, 0)
        rows = tf.maximum(size, 1)
        clone_data = tf.nest.map_structure(
            lambda t: None if t is None else t[start : start + rows], data
        )
        size_f = tf.cast(size, "float32")
        clone_batches.append(
            CloneBatch(
                clone_data,
                size,
                tf.math.divide_no_nan(size_f, total),
                tf.minimum(size_f, 1.0),
            )
        )
    return clone_batches


def _batch_size(x):
    inputs = [t for t in tf.nest.flatten(x) if t is not None]
    if not inputs:
        # Keras's own message for a required input given as `None`.
        raise ValueError(
            "The input 'x' is not optional: CloneModel needs at least one "
            f"input tensor to split the batch. Received: x={x!r}."
        )
    return tf.shape(inputs[0], out_type=tf.int32)[0]


def merge_outputs(outputs, sizes):
    """Concatenates the clones' outputs in input order, dropping padding."""
    return tf.nest.map_structure(
        lambda *parts: tf.concat([p[:n] for p, n in zip(parts, sizes)], axis=0),
        *outputs,
    )


def loss_reduction(loss):
    """`"share"` or `"sum"`: how clone losses combine into the batch loss;
    a `ValueError` for a loss that cannot split."""
    kinds = set()
    for entry in tf.nest.flatten(loss):
        if entry is None:
            continue
        reduction = getattr(entry, "reduction", "sum_over_batch_size")
        if reduction in _SHARE_REDUCTIONS:
            kinds.add("share")
        elif reduction in _SUM_REDUCTIONS:
            kinds.add("sum")
        else:
            raise ValueError(
                f"CloneModel cannot split a loss with reduction={reduction!r} "
                "across clones and reproduce the full-batch value "
                f"(loss: {entry!r}). Use reduction='sum_over_batch_size' "
                "(the default) or 'sum'."
            )
    if len(kinds) > 1:
        raise ValueError(
            "CloneModel needs all compiled losses to use the same kind of "
            "reduction: either all 'sum_over_batch_size'/'mean', or all "
            f"'sum'. Received: loss={loss!r}."
        )
    return kinds.pop() if kinds else "share"


@contextlib.contextmanager
def clone_scope(i, deployment):
    """Clone i's device and name scope, as `model_deploy`'s."""
    scope = deployment.clone_scope(i)
    with tf.device(deployment.clone_device(i)):
        with tf.name_scope(scope) if scope else contextlib.nullcontext():
            yield


def call_clone(model, i, x, training):
    """Clone i's forward pass of `model` on its slice `x`."""
    with warnings.catch_warnings():
        if i > 0:  # They would repeat clone 0's.
            warnings.simplefilter("ignore")
        if internals.call_has_training_arg(model):
            y_pred = model(x, training=training)
        else:
            y_pred = model(x)
    for output in tf.nest.flatten(y_pred):
        if internals.keras_mask(output) is not None:
            raise ValueError(
                "CloneModel cannot split a loss over masked outputs "
                "exactly: Keras normalises a masked loss by the number of "
                "unmasked entries of each slice. Remove the mask from the "
                "model's outputs, or train it as a plain `keras.Model`."
            )
    return y_pred


def run(model, batch, deployment, reads=None):
    """Every clone's forward pass and loss on its slice of `batch`, under
    its device and name scope in `deployment`; in training (given `reads`),
    its gradients too.

    In training a clone reads what `reads` says (`clone_reads.VariableReads`:
    the model's variables or their replicated copies; `GivenValues`), which
    also keeps the float state each clone moves.
    """
    reduction = loss_reduction(model.loss)  # Refuses what cannot split.
    training = reads is not None
    result = ClonesRun([], [], [], [], [])
    for i, clone in enumerate(batch.clones):
        scope = reads.scope(i) if training else None
        sources = reads.sources(i) if training else None
        tape = tf.GradientTape() if training else contextlib.nullcontext()
        with clone_scope(i, deployment):
            with tape:
                if training and reads.watched:
                    tape.watch(sources)
                with scope or contextlib.nullcontext():
                    y_pred, loss = _forward(model, i, clone, training)
                    contribution = _weighted_loss(model, loss, clone, reduction)
                scaled = contribution
                if training and model.optimizer is not None:
                    scaled = model.optimizer.scale_loss(contribution)
            if training:
                result.grads.append(tape.gradient(scaled, sources))
                reads.keep_clone_update(clone.share, scope)
        result.contributions.append(contribution)
        result.losses.append(loss)
        result.sizes.append(clone.size)
        result.y_preds.append(y_pred)
    return result


def _forward(model, i, clone, training):
    """Clone i's predictions and loss (as Keras computes it) on its
    slice."""
    x_i, y_i, sw_i = clone.data
    y_pred = call_clone(model, i, x_i, training=training)
    loss = internals.compute_loss(
        model,
        x=x_i,
        y=y_i,
        y_pred=y_pred,
        sample_weight=sw_i,
        training=training,
    )
    return y_pred, loss


def _weighted_loss(model, loss, clone, reduction):
    """A clone's contribution to the loss of the whole batch."""
    if reduction == "share":
        return loss * clone.share
    # Summed data losses add up; `add_loss` and regularization terms are
    # means over the slice, so they still count by share.
    extra = sum(model.losses, tf.zeros((), loss.dtype)) / (
        model.distribute_strategy.num_replicas_in_sync
    )
    return (loss - extra) * clone.present + extra * clone.share


def combined_gradients(clone_grads, batch, copies, deployment):
    """The clones' gradients (one list per clone) of `batch`, summed, and,
    for replicated variables (`copies`, else None), each copy's all-reduced
    gradients (else `[]`).

    Sparse gradients stay sparse: their rows concatenated (summed on
    apply), but those of each of `shared_rows`' `SharedRows` summed.
    """
    shared = shared_rows(clone_grads, batch)
    if copies is None:
        summed = [_sum_gradients(g) for g in zip(*clone_grads)]
        return merge_shared_rows(summed, shared), []
    copy_grads = []
    for i, grads in enumerate(copies.all_reduce(clone_grads)):
        with tf.device(deployment.clone_device(i)):
            copy_grads.append(merge_shared_rows(grads, shared))
    return copy_grads[0], copy_grads


def _sum_gradients(grads):
    present = [g for g in grads if g is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    if all(isinstance(g, tf.IndexedSlices) for g in present):
        return tf.IndexedSlices(
            tf.concat([g.values for g in present], 0),
            tf.concat([g.indices for g in present], 0),
            present[0].dense_shape,
        )
    return tf.add_n([tf.convert_to_tensor(g) for g in present])


class SharedRows(typing.NamedTuple):
    """A sparse gradient whose rows may be the same in every clone."""

    same: tf.Tensor  # Whether every clone's indices are equal (a boolean).
    clones: int  # How many clones' rows the summed gradient concatenates.


def shared_rows(clone_grads, batch):
    """Per variable, a `SharedRows` where its sparse gradient's rows come
    from a lookup made once per batch (a position embedding), else None.

    A plain model's gradient has such a lookup's rows once; the clones'
    concatenated gradients have them once per clone, and an optimizer that
    squares each row (Adam) then differs. A lookup is made once per batch
    where its indices depend on nothing of the batch, neither its values nor
    its shape (found in the traced step's graph); the clones' rows are then
    summed where the indices agree when the step runs (random indices drawn
    per clone do not). Indices that depend on the batch (token embeddings)
    keep one row per occurrence, as the plain model's gradient has. An
    eager step cannot tell them apart: it keeps the rows apart, and warns
    where they agree.

    Args:
        clone_grads: One list of gradients per clone.
        batch: The `Batch` the clones ran on.
    """
    shared = []
    batch_ops = None
    for grads in zip(*clone_grads):
        if len(grads) < 2 or not all(
            isinstance(g, tf.IndexedSlices) for g in grads
        ):
            shared.append(None)
            continue
        indices = [g.indices for g in grads]
        if tf.executing_eagerly():
            _warn_if_shared_when_eager(indices)
            shared.append(None)
            continue
        if batch_ops is None:
            batch_ops = {t.op.name for t in _tensors(batch.data)}
        if any(_depends_on(i, batch_ops) for i in indices):
            shared.append(None)
            continue
        same = _all_equal(indices)
        shared.append(None if same is False else SharedRows(same, len(grads)))
    return shared


def merge_shared_rows(grads, shared):
    """`grads` (summed, or all-reduced: each variable's rows concatenated
    clone after clone) with the rows of each `SharedRows` summed where they
    agree, in one clone's order (a row the lookup repeats stays repeated,
    as in the plain model's gradient)."""
    return [
        grad if rows is None else _merged(grad, rows)
        for grad, rows in zip(grads, shared)
    ]


def _merged(grad, rows):
    def summed():
        blocks = tf.concat([[rows.clones, -1], tf.shape(grad.values)[1:]], 0)
        per_clone = tf.shape(grad.indices)[0] // rows.clones
        return (
            tf.reduce_sum(tf.reshape(grad.values, blocks), 0),
            grad.indices[:per_clone],
        )

    values, indices = tf.cond(
        rows.same, summed, lambda: (grad.values, grad.indices)
    )
    return tf.IndexedSlices(values, indices, grad.dense_shape)


def _tensors(data):
    flat = tf.nest.flatten(data, expand_composites=True)
    return [t for t in flat if isinstance(t, tf.Tensor)]


def _depends_on(tensor, op_names):
    """Whether `tensor` may depend on an op of `op_names`, its values or
    its shape (a graph walk back through every op's inputs)."""
    stack, seen = [tensor.op], set()
    while stack:
        op = stack.pop()
        if op.name in op_names:
            return True
        if op.name in seen:
            continue
        seen.add(op.name)
        stack.extend(t.op for t in op.inputs)
    return False


def _all_equal(indices):
    """Whether the clones' indices are the same: a boolean tensor, or
    False where their shapes differ when traced."""
    first = indices[0]
    if not all(first.shape.is_compatible_with(i.shape) for i in indices):
        return False
    same = tf.constant(True)
    for other in indices[1:]:
        same = tf.logical_and(same, _equal(first, other))
    return same


def _equal(a, b):
    if a.shape.is_fully_defined() and b.shape.is_fully_defined():
        return tf.reduce_all(tf.equal(a, b))  # Of the same shape.
    return tf.cond(
        tf.equal(tf.size(a), tf.size(b)),
        lambda: tf.reduce_all(tf.equal(a, b)),
        lambda: tf.constant(False),
    )


def _warn_if_shared_when_eager(indices):
    """Warns (once, under Python's default filter) where an eager step's
    clones have the same indices."""
    if not bool(_all_equal(indices)):
        return
    warnings.warn(
        "A sparse gradient (e.g. an `Embedding`'s) has the same indices in "
        "every clone of this eager step (`run_eagerly=True`). CloneModel "
        "cannot tell an eager step's lookup made once per batch (a position "
        "embedding: the plain model's gradient has its rows once) from one "
        "that follows the batch (tokens: one row per occurrence), so it "
        "keeps each clone's rows; with an optimizer that squares each row "
        "(Adam) a lookup made once per batch then trains unlike the plain "
        "model. Compile with `run_eagerly=False` for the plain model's "
        "update.",
        stacklevel=2,
    )


def computed_step(result, batch, y_pred, **training):
    """The `ComputedStep` of a `run` on `batch`; `training` gives a
    training step's gradients and moved state."""
    x, y, sample_weight = batch.data
    return ComputedStep(
        loss=tf.add_n(result.contributions),
        clone_contributions=result.contributions,
        clone_losses=result.losses,
        clone_sizes=result.sizes,
        x=x,
        y=y,
        y_pred=y_pred,
        sample_weight=sample_weight,
        batch_size=batch.size,
        **training,
    )
