"""`LossSummaries`: `model_deploy`'s loss and gradient summaries."""

import numbers
import os

import keras
import tensorflow as tf

from keras_clones import gradients
from keras_clones import step_hooks
from keras_clones.clone_model.model import CloneModel


class _StepRecorder:
    """Keeps what only the training step sees, for `LossSummaries` to write.

    A step hook (`keras_clones.step_hooks`): `CloneModel.train_step` calls
    `observe` inside the traced step, on the optimizer device, after summing
    the clones' gradients and before the update. A plain object (not a
    layer), so nothing it holds becomes a model weight or is saved.
    """

    def __init__(self, model, summarize_gradients):
        self._optimizer = model.optimizer
        self.regularization_loss = keras.metrics.Mean(
            name="regularization_loss"
        )
        # One copy per trainable variable, created here because the traced
        # step cannot create variables.
        self._copies = {}
        if summarize_gradients:
            for variable in model.trainable_variables:
                self._copies[id(variable)] = keras.Variable(
                    tf.zeros(variable.shape, variable.dtype),
                    trainable=False,
                    name=f"{variable.name}_gradient",
                )
        # (variable, copy) for the variables the step gives a gradient to,
        # filled when the step is traced.
        self.gradients = []

    def observe(self, step):
        """Records one step's regularization loss and gradients."""
        grads, variables = step.grads, step.variables
        # Weight regularizers only, as model_deploy's REGULARIZATION_LOSSES.
        penalties = [
            tf.cast(v.regularizer(v), "float32")
            for v in variables
            if v.regularizer is not None
        ]
        self.regularization_loss.update_state(
            tf.add_n(penalties) if penalties else 0.0
        )
        if not self._copies:
            return
        # The clones' gradients are of the scaled loss (mixed precision).
        scale = self._optimizer.scale_loss(1.0)
        self.gradients = []
        for grad, variable in zip(grads, variables):
            copy = self._copies.get(id(variable))
            if grad is None or copy is None:
                continue
            grad = tf.convert_to_tensor(grad)  # IndexedSlices, densified.
            copy.assign(grad / tf.cast(scale, grad.dtype))
            self.gradients.append((variable, copy))


@keras.saving.register_keras_serializable(package="keras_clones")
class LossSummaries(keras.callbacks.Callback):
    """Writes TF-Slim `model_deploy`'s loss summaries to TensorBoard.

    For a `CloneModel`, writes under `log_dir/train`:

    - `total_loss`: the model's loss (`logs["loss"]`);
    - `clone_i/clone_loss`: each clone's loss (`logs["clone_i_loss"]`), with
      more than one clone;
    - `regularization_loss`: the sum of the trainable variables' weight
      regularization penalties, as each training step computes it before
      its update, averaged over the steps since the last write;
    - with `summarize_gradients=True`, for each trainable variable that gets
      a gradient, a histogram `<variable.path>:gradient` and a scalar
      `<variable.path>:gradient_norm` (its L2 norm) of the gradient of the
      latest step (summed over the clones, unscaled).

    At the end of each epoch with validation, `val_loss` and
    `val_clone_i_loss` go to `log_dir/validation` as `total_loss` and
    `clone_i/clone_loss`.

    The step of every summary is `model.optimizer.iterations`, the number of
    training steps, as `model_deploy`'s global step. Keras gives callbacks
    batch losses as running means over the epoch so far, so with
    `update_freq="batch"` or an integer the loss scalars are those running
    means (as `keras.callbacks.TensorBoard`'s `batch_loss`).

    The callback uses its own summary writers and never sets a default
    writer, so `keras.callbacks.TensorBoard` can use the same `log_dir`: it
    adds the other metrics, the learning rate and weight histograms.

    Args:
        log_dir: Directory for the event files (a string or path).
        summarize_gradients: Whether to write the gradient histograms and
            norms. They cost one copy of the gradients per training step.
        update_freq: `"epoch"` to write the training summaries at the end of
            each epoch, `"batch"` after every batch, or an integer `N` to
            write them every `N` batches.

    Example:

    ```python
    model = keras_clones.CloneModel(inputs, outputs, deployment=deployment)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(
        x,
        y,
        validation_split=0.1,
        callbacks=[
            keras_clones.callbacks.LossSummaries(
                "logs", summarize_gradients=True
            ),
            keras.callbacks.TensorBoard("logs"),
        ],
    )
    # Then: tensorboard --logdir logs
    ```
    """

    def __init__(self, log_dir, summarize_gradients=False, update_freq="epoch"):
        super().__init__()
        if not isinstance(log_dir, (str, os.PathLike)):
            raise TypeError(
                "`log_dir` must be a string or a path. Received: "
                f"log_dir={log_dir!r} of type {type(log_dir).__name__}."
            )
        if not isinstance(summarize_gradients, bool):
            raise TypeError(
                "`summarize_gradients` must be True (write the gradients' "
                "histograms and norms) or False. Received: "
                f"summarize_gradients={summarize_gradients!r} of type "
                f"{type(summarize_gradients).__name__}."
            )
        if isinstance(update_freq, numbers.Integral) and not isinstance(
            update_freq, bool
        ):
            update_freq = int(update_freq)  # A NumPy integer too.
        if update_freq not in ("epoch", "batch") and (
            not isinstance(update_freq, int)
            or isinstance(update_freq, bool)
            or update_freq < 1
        ):
            raise ValueError(
                '`update_freq` must be "epoch", "batch" or an integer >= 1. '
                f"Received: update_freq={update_freq!r}."
            )
        self.log_dir = os.fspath(log_dir)
        self.summarize_gradients = summarize_gradients
        self.update_freq = update_freq
        self._batches_per_write = 1 if update_freq == "batch" else update_freq
        self._recorder = None
        self._train_writer = None
        self._val_writer = None
        self._batches_seen = 0
        self._batches_before_epoch = 0

    def on_train_begin(self, logs=None):
        if not isinstance(self.model, CloneModel):
            raise ValueError(
                "LossSummaries summarises the clones of a "
                "`keras_clones.CloneModel`, but the model is a "
                f"{type(self.model).__name__}. Use "
                "`keras.callbacks.TensorBoard` for other models."
            )
        self._recorder = _StepRecorder(self.model, self.summarize_gradients)
        step_hooks.attach(self.model, self.model.step_hooks, self._recorder)
        self._train_writer = tf.summary.create_file_writer(
            os.path.join(self.log_dir, "train")
        )
        self._val_writer = tf.summary.create_file_writer(
            os.path.join(self.log_dir, "validation")
        )
        self._batches_seen = 0
        self._batches_before_epoch = 0

    def on_train_batch_end(self, batch, logs=None):
        if self.update_freq == "epoch":
            return
        # With steps_per_execution > 1, `batch` is the last index of the
        # batches just run (past the end of a short last execution).
        done = batch + 1
        if self.params.get("steps"):
            done = min(done, self.params["steps"])
        seen = self._batches_before_epoch + done
        every = self._batches_per_write
        if seen // every > self._batches_seen // every:
            self._write_train(logs or {})
        self._batches_seen = seen

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        self._batches_before_epoch = self._batches_seen
        if self.update_freq == "epoch":
            self._write_train(logs)
        val_scalars = _loss_scalars(logs, self.model, prefix="val_")
        if val_scalars:
            self._write(self._val_writer, val_scalars)

    def on_train_end(self, logs=None):
        self._train_writer.close()
        self._val_writer.close()
        step_hooks.detach(self.model, self.model.step_hooks, self._recorder)
        self._recorder = None

    def _write_train(self, logs):
        scalars = _loss_scalars(logs, self.model)
        mean = self._recorder.regularization_loss
        scalars["regularization_loss"] = mean.result()
        mean.reset_state()
        histograms = {}
        for variable, gradient in self._recorder.gradients:
            value = gradient.value
            name = gradients.variable_name(variable)
            histograms[f"{name}:gradient"] = value
            scalars[f"{name}:gradient_norm"] = tf.norm(value)
        self._write(self._train_writer, scalars, histograms)

    def _write(self, writer, scalars, histograms=None):
        step = int(self.model.optimizer.iterations.numpy())
        # `keras.callbacks.TensorBoard(update_freq=N)` keeps a `record_if`
        # set during `fit`; these summaries must not depend on it.
        with writer.as_default(), tf.summary.record_if(True):
            for tag, value in scalars.items():
                tf.summary.scalar(tag, value, step=step)
            for tag, value in (histograms or {}).items():
                tf.summary.histogram(tag, value, step=step)
        writer.flush()

    def get_config(self):
        return {
            "log_dir": self.log_dir,
            "summarize_gradients": self.summarize_gradients,
            "update_freq": self.update_freq,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _loss_scalars(logs, model, prefix=""):
    """`{tag: value}` for the total and clone losses found in `logs`."""
    keys = {"total_loss": f"{prefix}loss"}
    for i in range(model.deployment.num_clones):
        keys[f"clone_{i}/clone_loss"] = f"{prefix}clone_{i}_loss"
    return {tag: logs[key] for tag, key in keys.items() if key in logs}
