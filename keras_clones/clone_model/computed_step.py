"""`ComputedStep`: one training step computed and not yet applied."""

import typing


class ComputedStep(typing.NamedTuple):
    """One training step computed and not yet applied: what
    `CloneModel.compute` returns, and `apply` and `log` take.

    A named tuple of tensors (and None), so that `tf.nest`, and
    parameter-server training between a worker and the coordinator, carry
    it as it is. The fields after `batch_size` are a training step's (empty
    for an evaluation step).
    """

    loss: object  # The batch's loss: the clones' contributions, added.
    clone_contributions: list  # Each clone's share of the batch loss.
    clone_losses: list  # Each clone's loss on its slice (`clone_i_loss`).
    clone_sizes: list  # Each clone's rows.
    x: object  # The inputs, or None where they stay on a worker.
    y: object
    y_pred: object  # The predictions of the whole batch, in input order.
    sample_weight: object
    batch_size: object  # Rows of the batch (int32).
    grads: list = ()  # Per trainable variable, summed over clones, or None.
    copy_grads: list = ()  # Replicated variables: each copy's gradients.
    moved_state: list = ()  # The float state the clones move, after it.
    non_trainable_values: object = None  # With `values`: all, moved.
    # With a guard: whether the loss, then each gradient, is finite (a
    # boolean vector, `step_hooks.finiteness`), the verdict it judges.
    finite: object = None
