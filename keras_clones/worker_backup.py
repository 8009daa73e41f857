"""`BackupAndRestore` across workers, on any backend: Keras's callback as
each worker runs it, with what each worker holds of its own.

Keras's backup (the model's weights and the optimizer's variables, and the
epoch) is the chief's. Under an `AGNOptimizer` each worker also holds a
state of its own (local weights, inner-optimizer slots, accumulators, its
share of a commit in flight: `TrainerSeams.worker_state`), which each
worker saves beside the chief's files, on the backup directory all workers
share, under `keras_clones_workers/`: one file per worker and optimizer
step, stamped with the step and the number of workers. Every worker also
writes its stamp under plain training, so that a resume knows on how many
workers the backup was made.

On restore each worker loads the chief's backup (Keras), then its own
state from the files stamped with the restored step, if they agree and are
complete; on another number of workers, as `keras_clones.agn.worker_state`
defines. The chief prints one line saying what was restored.

Across TensorFlow workers `multi_worker.backup.WorkerBackup` runs it, and
across JAX processes `jax_processes.backup.ProcessBackup`.
"""

import io
import json
import os
import re
import warnings
import zipfile

import keras
import numpy as np

from keras_clones import _keras_internals as internals
from keras_clones._tensorflow import ON_TENSORFLOW
from keras_clones._tensorflow import tf
from keras_clones.agn.optimizer import agn_of

STATE_DIRECTORY = "keras_clones_workers"
# The chief's mark, beside Keras's files, that the backup was made across
# workers: without it, a backup without `STATE_DIRECTORY` is one made in one
# process (or by an older keras_clones), resumed from the chief's state.
MARK = "keras_clones_workers.json"
# What the chief prints at its first step: after a resume, and otherwise
# (the launcher reads them: `keras_clones.launcher.workers.TRAINING`).
TRAINING = "keras_clones: training"
TRAINING_AGAIN = f"{TRAINING} again"
_NAME = re.compile(r"step_(\d+)\.worker_(\d+)_of_(\d+)\.npz$")


def check_plain(callback, who):
    """Refuses a subclass of `BackupAndRestore`, whose overrides the
    backup `who` runs itself would lose."""
    if type(callback) is not keras.callbacks.BackupAndRestore:
        raise TypeError(
            f"{who} `keras.callbacks.BackupAndRestore` itself on every "
            "worker, saving each worker's own state beside the chief's "
            "backup, so a subclass's overrides would not run. Received: "
            f"{type(callback).__name__}. Pass `keras.callbacks."
            "BackupAndRestore(backup_dir, ...)`, and put what the subclass "
            "adds in a callback of its own."
        )


class _KerasFiles:
    """Keras's file operations, where TensorFlow's are absent."""

    def __getattr__(self, name):  # isdir, listdir, remove, File.
        return getattr(internals.keras_files(), name)

    @staticmethod
    def makedirs(path):
        files = internals.keras_files()
        try:
            files.makedirs(path)
        except FileExistsError:  # Locally, already there.
            pass

    @staticmethod
    def replace(src, dst):
        files = internals.keras_files()
        if files.is_remote_path(src):
            files.copy(src, dst)
            files.remove(src)
        else:
            os.replace(src, dst)


class _TensorFlowFiles:
    """`tf.io.gfile`'s, which also reach remote file systems."""

    makedirs = staticmethod(lambda path: tf.io.gfile.makedirs(path))
    exists = staticmethod(lambda path: tf.io.gfile.exists(path))
    isdir = staticmethod(lambda path: tf.io.gfile.isdir(path))
    listdir = staticmethod(lambda path: tf.io.gfile.listdir(path))
    remove = staticmethod(lambda path: tf.io.gfile.remove(path))
    File = staticmethod(lambda path, mode="r": tf.io.gfile.GFile(path, mode))
    replace = staticmethod(
        lambda src, dst: tf.io.gfile.rename(src, dst, overwrite=True)
    )


_files = _TensorFlowFiles() if ON_TENSORFLOW else _KerasFiles()


class BackupWithWorkerState(keras.callbacks.BackupAndRestore):
    """`callback`, a `keras.callbacks.BackupAndRestore`, as worker `worker`
    of `workers` runs it (see the module's docstring).

    Args:
        callback: The user's `BackupAndRestore`.
        directory: Where Keras's files are read and written.
        worker: This worker's index.
        workers: The number of workers.
        is_chief: Whether this worker is the chief.
        global_batch: The examples of one step across the workers, where
            `fit`'s arguments tell (else None): the chief's mark records
            it, and a resume says when it changed.
    """

    # Whether this worker writes Keras's backup (to `directory`).
    writes_keras_backup = True
    # Whether this process writes its worker's own state (a worker's other
    # processes hold the same).
    writes_own_state = True

    def __init__(
        self, callback, directory, worker, workers, is_chief, global_batch=None
    ):
        super().__init__(
            directory,
            save_freq=callback.save_freq,
            double_checkpoint=callback.double_checkpoint,
            delete_checkpoint=callback.delete_checkpoint,
        )
        self.shared_dir = os.fspath(callback.backup_dir)
        self.state_dir = os.path.join(self.shared_dir, STATE_DIRECTORY)
        self.worker = worker
        self.workers = workers
        self.is_chief = is_chief
        self.global_batch = global_batch
        self._epoch = 0
        self._changes = []  # What changed since the backup, said at resume.
        # Whether the resume line says the global batch changed.
        self.batch_changed = False
        self._resumed = False
        self._first_step = True

    def on_train_begin(self, logs=None):
        # Checked now, not at the first save an epoch later.
        try:
            _files.makedirs(self.state_dir)
        except Exception as error:  # OSError, or TensorFlow's file errors.
            raise ValueError(
                "`BackupAndRestore` cannot write its backup in "
                f"{self.shared_dir!r}: making {self.state_dir!r} failed "
                f"({type(error).__name__}: {error}). Pass a `backup_dir` that "
                "every worker can create and write."
            ) from None
        super().on_train_begin(logs)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        super().on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._epoch = epoch + 1
        super().on_epoch_end(epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        if self._first_step and self.is_chief:
            step = int(self.model.optimizer.iterations.numpy())
            said = TRAINING_AGAIN if self._resumed else TRAINING
            print(f"{said} at optimizer step {step}.", flush=True)
        self._first_step = False
        super().on_train_batch_end(batch, logs)

    # Saving.

    def _save_model(self):
        # Before Keras's save: the chief's backup never runs ahead of a
        # worker's (`after_own_state`).
        step = int(self.model.optimizer.iterations.numpy())
        if self.writes_own_state:
            self._write_own(step)
        self.after_own_state()
        if self.is_chief:
            mark = {"workers": self.workers, "global_batch": self.global_batch}
            self._write(MARK, json.dumps(mark).encode())
        if self.writes_keras_backup:
            super()._save_model()
        if self.is_chief:
            self._keep_the_last_two_steps(step)

    def after_own_state(self):
        """Runs on every worker once it wrote its own state, before the
        chief writes Keras's backup: where Keras's save does not wait for
        every worker (across TensorFlow workers it does: it reads on-read
        variables), waits until every worker wrote its own."""

    def _write_own(self, step):
        stamp = {"step": step, "epoch": self._epoch, "workers": self.workers}
        agn = agn_of(self.model.optimizer)
        if agn is not None:
            stamp.update(_rule(agn))
        arrays = {"stamp": np.array(json.dumps(stamp))}
        if agn is not None:
            kinds, values = agn.trainer_seams.worker_state()
            arrays["kinds"] = np.array(kinds)
            arrays.update({f"state_{i}": v for i, v in enumerate(values)})
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        name = f"step_{step}.worker_{self.worker}_of_{self.workers}.npz"
        self._write(os.path.join(STATE_DIRECTORY, name), buffer.getvalue())

    def _write(self, name, data):
        """Writes `data` (bytes) to `name` in the backup directory, whole or
        not at all."""
        path = os.path.join(self.shared_dir, name)
        _files.makedirs(os.path.dirname(path))
        with _files.File(f"{path}.tmp", "wb") as f:
            f.write(data)
        _files.replace(f"{path}.tmp", path)

    def _saved(self):
        """`{step: {worker: (workers, path)}}` of the state files present:
        each stamped, in its name, with the optimizer step, the worker and
        the number of workers."""
        saved = {}
        if _files.isdir(self.state_dir):
            for name in _files.listdir(self.state_dir):
                match = _NAME.match(name)
                if match:
                    step, worker, workers = map(int, match.groups())
                    path = os.path.join(self.state_dir, name)
                    saved.setdefault(step, {})[worker] = (workers, path)
        return saved

    def _keep_the_last_two_steps(self, step):
        """Removes the files of steps after `step` (left by a run this one
        resumed from an earlier backup) and of all but the last two up to
        it (Keras's `double_checkpoint` may fall back to the previous)."""
        saved = self._saved()
        earlier = sorted(s for s in saved if s <= step)
        for old in earlier[:-2] + [s for s in saved if s > step]:
            for _, path in saved[old].values():
                _files.remove(path)

    # Restoring.

    def _load_model(self):
        try:
            super()._load_model()
            metadata = internals.backup_metadata(self)
        except json.JSONDecodeError as error:
            raise ValueError(
                self._unreadable(
                    internals.backup_metadata_path(self), "not JSON", error
                )
            ) from None
        except ValueError as error:
            if "could not be loaded" not in str(error):
                raise
            raise ValueError(
                f"The backup in {self.shared_dir!r} was made by another model "
                "or optimizer: its variables do not match this model's (Keras "
                f"said: {str(error).splitlines()[0]}){self._settings_said()}. "
                "Resume with the model "
                "and optimizer the backup was made with, or remove the "
                "directory to start training over."
            ) from None
        if metadata is None:
            return  # Nothing was backed up: training starts.
        step = int(self.model.optimizer.iterations.numpy())
        agn = agn_of(self.model.optimizer)
        # Every worker reads and checks its files, then they agree, so that
        # a worker whose files are broken does not leave the others waiting
        # in their first step.
        try:
            before, own = self._read_files(step, metadata, agn)
        except Exception:
            self.failing_workers(True)
            raise
        failing = self.failing_workers(False)
        if failing:
            who = ", ".join(map(str, failing))
            raise ValueError(
                f"The backup in {self.shared_dir!r} cannot be restored: "
                f"worker(s) {who} could not read their files (each one's "
                "error says why). Restore the directory as it was saved, or "
                "remove it to start training over."
            )
        if agn is not None and before is not None:
            agn.trainer_seams.restore_worker_state(*own, before)
        self._resumed = True
        if self.is_chief:
            print(self.resume_line(metadata, step, before, agn), flush=True)
        if self.save_freq != "epoch":
            warnings.warn(
                f"The backup in {self.shared_dir!r} was made after batch "
                f"{metadata['batch'] + 1} of epoch {metadata['epoch'] + 1}, "
                "and Keras resumes at an epoch's start: that epoch's first "
                "batches are trained again, so the resumed run is not the "
                "uninterrupted one. For an exact resume back up at epochs' "
                "ends (`save_freq='epoch'`).",
                stacklevel=2,
            )

    def failing_workers(self, failing):
        """Every worker's `failing` (this one's: whether reading its files
        failed), gathered: the indices of those that failed. Each backend's
        callback gathers them across its workers; alone, this one's."""
        return [self.worker] if failing else []

    def _read_files(self, step, metadata, agn):
        """The number of workers the backup was made on (None: no stamps)
        and this worker's own `(kinds, arrays)` at `step` (None each where
        it has none), checked."""
        files = self._saved().get(step, {})
        before = self._check_complete(step, files, agn is not None)
        self._changes = self._batch_change() if self.is_chief else []
        own = (None, None)
        if agn is not None and before is not None and self.worker < before:
            own = self._read_own(files[self.worker][1], metadata, agn)
        return before, own

    def _check_complete(self, step, files, every_worker):
        """The number of workers the backup was made on, after checking
        that every one's file is there and stamped alike; None for a backup
        without stamps (made in one process, or by an older keras_clones).
        """
        if not files:
            if step == 0 and self._saved():
                raise ValueError(
                    f"The backup in {self.shared_dir!r} was made later than "
                    "optimizer step 0, but the optimizer's variables were "
                    "not loaded from it (Keras warns when the saved "
                    f"optimizer has other variables){self._settings_said()}"
                    ": resume with the model and optimizer the backup was "
                    "made with, or remove the directory to start training "
                    "over."
                )
            if self._saved():
                raise ValueError(self._incomplete(step, "no worker's file"))
            if _files.exists(os.path.join(self.shared_dir, MARK)):
                raise ValueError(
                    f"The backup in {self.shared_dir!r} was made across "
                    f"workers ({MARK}), but it has no {STATE_DIRECTORY}/ "
                    "files, which hold each worker's own state. Restore the "
                    "directory as it was saved, or remove it to start "
                    "training over."
                )
            return None
        workers = {w for w, _ in files.values()}
        if len(workers) > 1:
            raise ValueError(
                self._incomplete(
                    step, f"files stamped with {sorted(workers)} workers"
                )
            )
        before = workers.pop()
        # Without AGN the files are stamps only, and a worker's may not be
        # written yet when the chief's backup is (nothing waits for it).
        needed = range(before) if every_worker else ()
        missing = sorted(set(needed) - set(files))
        if missing:
            raise ValueError(
                self._incomplete(
                    step, f"no file of worker(s) {missing} of {before}"
                )
            )
        return before

    def _settings_said(self):
        """Where the optimizer's variables were not loaded: the settings of
        this `AGNOptimizer` that differ from its stamp in the newest file,
        as a clause (empty where none differs or none is known)."""
        agn = agn_of(self.model.optimizer)
        saved = self._saved()
        if agn is None:
            return ""
        _, path = next(iter(saved[max(saved)].values()))
        try:
            with _files.File(path, "rb") as f:
                stamp = json.loads(str(np.load(io.BytesIO(f.read()))["stamp"]))
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):
            return ""  # Unreadable: the refusal stands without it.
        differ = _differences(stamp, _rule(agn), list(_rule(agn)))
        if not differ:
            return ""
        return f"; its settings differ: {'; '.join(differ)}"

    def _read_own(self, path, metadata, agn):
        """This worker's saved `(kinds, arrays)`, checked against the
        position Keras restored and against `agn`'s rule and period."""
        try:
            with _files.File(path, "rb") as f:
                saved = dict(np.load(io.BytesIO(f.read())))
            stamp = json.loads(str(saved["stamp"]))
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
            raise ValueError(
                self._unreadable(path, "not a worker's state", error)
            ) from None
        if stamp["epoch"] != metadata["epoch"]:
            raise ValueError(
                self._incomplete(
                    stamp["step"],
                    f"worker {self.worker}'s file of epoch {stamp['epoch']}, "
                    f"the weights' epoch being {metadata['epoch']}",
                )
            )
        self._changes = self._check_rule(stamp, agn) + self._changes
        kinds = [str(k) for k in saved.get("kinds", ())]
        return kinds, [saved[f"state_{i}"] for i in range(len(kinds))]

    def _check_rule(self, stamp, agn):
        """What changed in `agn`'s rule and period since the backup whose
        worker file has `stamp` (older backups record neither): another
        rule, or another period in the middle of a period, is refused;
        another period at a period's end is said at the resume."""
        now = _rule(agn)
        old = {key: stamp[key] for key in now if key in stamp}
        rule = ("commit", "normalize")
        if any(old.get(key, now[key]) != now[key] for key in rule):
            raise ValueError(
                f"The backup in {self.shared_dir!r} was made with "
                f"{_said(old, rule)}, and this AGNOptimizer has "
                f"{_said(now, rule)}: a period's state means another thing "
                "under each rule. Resume with the backup's, or remove the "
                "directory to start training over."
            )
        differ = _differences(old, now, _STATE_SETTINGS)
        if differ:
            raise ValueError(
                f"The backup in {self.shared_dir!r} was made with other "
                f"AGNOptimizer settings: {'; '.join(differ)}. The state "
                "saved means another thing under each. Resume with the "
                "backup's settings, or remove the directory to start "
                "training over."
            )
        changes = [
            f"{key} is now {now[key]!r} (it was {old[key]!r})"
            for key in ("communication_dtype",)
            if key in old and old[key] != now[key]
        ]
        period = old.get("communication_period", agn.communication_period)
        if period == agn.communication_period:
            return changes
        step = int(keras.ops.convert_to_numpy(agn.local_step))
        if step % period or agn.fragments > 1 or agn.overlap:
            raise ValueError(
                f"The backup in {self.shared_dir!r} was made with "
                f"communication_period={period} at local step {step}, and "
                "this AGNOptimizer has communication_period="
                f"{agn.communication_period}. The period can change only "
                "where one ends, with one fragment and no overlap (a local "
                f"step that divides by {period}). Resume with "
                f"communication_period={period}, or remove the directory to "
                "start training over."
            )
        return [
            f"communication_period is now {agn.communication_period} (it "
            f"was {period})",
            *changes,
        ]

    def _batch_change(self):
        """What the chief's mark says of the global batch, if it changed
        since the backup (backups without a mark, or a batch `fit` does
        not tell, say nothing)."""
        path = os.path.join(self.shared_dir, MARK)
        if self.global_batch is None or not _files.exists(path):
            return []
        try:
            with _files.File(path, "rb") as f:
                before = json.loads(f.read()).get("global_batch")
        except (OSError, ValueError, AttributeError) as error:
            raise ValueError(
                self._unreadable(path, "not the chief's mark", error)
            ) from None
        if before is None or before == self.global_batch:
            return []
        self.batch_changed = True
        now = self.global_batch
        return [f"the global batch is now {now} (it was {before})"]

    def _unreadable(self, path, what, error):
        return (
            f"The backup in {self.shared_dir!r} cannot be read: {path!r} is "
            f"{what} ({type(error).__name__}: {error}), perhaps cut short by a "
            "crash or changed by hand. Restore the directory as it was saved, "
            "or remove it to start training over."
        )

    def _incomplete(self, step, found):
        return (
            f"The backup in {self.shared_dir!r} cannot be restored as one "
            f"run: its weights are at optimizer step {step}, but "
            f"{STATE_DIRECTORY}/ holds {found} at that step (steps there: "
            f"{sorted(self._saved())}). Every worker writes its own state "
            "there: the backup directory must be one every worker reads "
            "and writes (a shared file system). Restore the directory as "
            "it was saved, or remove it to start training over."
        )

    def resume_line(self, metadata, step, before, agn):
        """What the chief prints after restoring the backup."""
        where = (
            f"keras_clones: resumed from the backup in {self.shared_dir!r} "
            f"at epoch {metadata['epoch'] + 1} (optimizer step {step})"
        )
        if before is None:
            return (
                f"{where}, made without worker stamps; on "
                f"{_count(self.workers)}, each from the chief's state."
            )
        what = f"{where}, made on {_count(before)}, resumed on {self.workers}"
        if agn is None:
            changes = "; ".join(self._changes)
            return f"{what}: {changes}." if changes else f"{what}."
        kept = min(before, self.workers)
        said = [
            _workers(
                0, kept, "{} keeps its own state", "{} keep their own state"
            )
        ]
        if self.workers > before:
            said.append(
                _workers(
                    before,
                    self.workers,
                    "{} starts its period from the centers",
                    "{} start their period from the centers",
                )
            )
        if self.workers < before:
            said.append(
                _workers(
                    kept,
                    before,
                    "what {} did since its period began is not committed",
                    "what {} did since their period began is not committed",
                )
            )
        return f"{what}: {'; '.join(said + self._changes)}."


def _rule(agn):
    """What a worker's stamp records of `agn`: its rule, period and the
    settings its state depends on."""
    return {
        "commit": agn.commit,
        "normalize": bool(agn.normalize),
        "communication_period": int(agn.communication_period),
        "communication_dtype": agn.communication_dtype,
        "fragments": int(agn.fragments),
        "overlap": bool(agn.overlap),
        "error_feedback": bool(agn.error_feedback),
        "outer_optimizer": type(agn.outer_optimizer).__name__,
    }


# What a backup's state means another thing under: a resume refuses
# another (the commits' dtype may change, and is said).
_STATE_SETTINGS = ("fragments", "overlap", "error_feedback", "outer_optimizer")


def _differences(old, now, keys):
    """Each of `keys` whose value in `old` (a stamp; older ones lack some)
    differs from `now`, said with both."""
    return [
        f"{key}={old[key]!r} in the backup, {now[key]!r} here"
        for key in keys
        if key in old and old[key] != now[key]
    ]


def _said(values, keys):
    return ", ".join(f"{key}={values[key]!r}" for key in keys)


def _count(workers):
    """`workers` workers: "1 worker", "2 workers"."""
    return f"{workers} worker{'' if workers == 1 else 's'}"


def _workers(first, end, one, several):
    """`one` or `several`, said of workers `first` to `end - 1`."""
    if end - first == 1:
        return one.format(f"worker {first}")
    return several.format(f"workers {first}-{end - 1}")
