"""A backup across workers, in one process: each worker's own state beside
the chief's backup (`multi_worker.backup.WorkerBackup`, under a stand-in
for the strategy's topology), its stamps and refusals, and the workers'
global batch. The runs across processes are in tests/test_multi_worker.py.
"""

import json
import os
import shutil
import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import InterruptAtEpoch
from helpers import assert_same_state
from helpers import data
from helpers import mlp

import keras_clones
from keras_clones.multi_worker import agreement
from keras_clones.multi_worker.backup import STATE_DIRECTORY
from keras_clones.multi_worker.backup import WorkerBackup
from keras_clones.multi_worker.backup import for_this_worker
from keras_clones.worker_backup import MARK


def topology(worker=0, workers=1):
    """What `WorkerBackup` reads of a `MultiWorkerMirroredStrategy`."""
    return types.SimpleNamespace(
        cluster_resolver=types.SimpleNamespace(task_id=worker),
        num_replicas_in_sync=workers,
        extended=types.SimpleNamespace(should_checkpoint=worker == 0),
    )


def agn_model(optimizer=None, **options):
    model = mlp(extra_losses=False)
    options.setdefault("communication_period", 4)
    optimizer = keras_clones.AGNOptimizer(
        optimizer or keras.optimizers.AdamW(0.01), **options
    )
    model.compile(optimizer, "sparse_categorical_crossentropy")
    return model


def backup(directory, **stand_in):
    callback = keras.callbacks.BackupAndRestore(str(directory))
    return WorkerBackup(callback, topology(**stand_in), str(directory))


def fit(model, *callbacks, epochs=5):
    x, y = data(48)
    return model.fit(
        x, y, batch_size=16, epochs=epochs, verbose=0, callbacks=list(callbacks)
    )


def test_a_resumed_run_equals_the_uninterrupted_one_mid_period(tmp_path):
    # Period 4, epochs of 3 steps: the backup after epoch 2 is mid-period,
    # with Adam's slots and accumulators that are this worker's own.
    uninterrupted = agn_model()
    fit(uninterrupted)
    crashed = agn_model()
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(crashed, backup(tmp_path), InterruptAtEpoch(2))
    assert sorted(os.listdir(tmp_path / STATE_DIRECTORY)) == [
        "step_3.worker_0_of_1.npz",
        "step_6.worker_0_of_1.npz",
    ]
    resumed = agn_model()
    history = fit(resumed, backup(tmp_path))
    assert len(history.epoch) == 3
    assert_same_state(uninterrupted, resumed)
    assert not tmp_path.exists()  # Training ended: Keras removed it.


def test_the_resume_says_what_it_restored(tmp_path, capsys):
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(agn_model(), backup(tmp_path), InterruptAtEpoch(2))
    fit(agn_model(), backup(tmp_path), epochs=3)
    assert (
        f"keras_clones: resumed from the backup in {str(tmp_path)!r} at "
        "epoch 3 (optimizer step 6), made on 1 worker, resumed on 1: "
        "worker 0 keeps its own state."
    ) in capsys.readouterr().out


def test_a_backup_missing_a_workers_state_is_refused(tmp_path):
    # Saved as worker 0 of 2: worker 1's file never came (a backup
    # directory that is not shared, say).
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(agn_model(), backup(tmp_path, workers=2), InterruptAtEpoch(2))
    with pytest.raises(ValueError) as error:
        fit(agn_model(), backup(tmp_path, workers=2))
    message = str(error.value)
    assert "its weights are at optimizer step 6" in message
    assert "no file of worker(s) [1] of 2 at that step" in message
    assert "a shared file system" in message


def test_a_backup_of_another_optimizer_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(agn_model(), backup(tmp_path), InterruptAtEpoch(2))
    other = agn_model(commit="weight_change")  # Other variables.
    with pytest.raises(ValueError, match="variables were not loaded from it"):
        fit(other, backup(tmp_path))


def test_a_backup_after_a_batch_warns_that_the_epoch_is_trained_again(
    tmp_path,
):
    callback = keras.callbacks.BackupAndRestore(str(tmp_path), save_freq=2)
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(
            agn_model(),
            WorkerBackup(callback, topology(), str(tmp_path)),
            InterruptAtEpoch(2),
        )
    callback = keras.callbacks.BackupAndRestore(str(tmp_path), save_freq=2)
    with pytest.warns(UserWarning, match="that epoch's first batches are"):
        fit(agn_model(), WorkerBackup(callback, topology(), str(tmp_path)))


@pytest.mark.parametrize(
    "x, batch_size, message",
    [
        (np.zeros((96, 2)), 64, "`batch_size` is 64 examples"),
        (np.zeros((96, 2)), None, "`batch_size` is 32 examples"),
        (
            tf.data.Dataset.from_tensor_slices(np.zeros((96, 2))).batch(64),
            None,
            "the dataset's batches hold 64 examples",
        ),
    ],
)
def test_a_global_batch_that_does_not_divide_by_the_workers_is_refused(
    x, batch_size, message
):
    with pytest.raises(ValueError) as error:
        agreement.check_global_batch(topology(workers=3), x, batch_size)
    assert message in str(error.value)
    assert "make it a multiple of 3 (e.g. 63 or 66)" in str(error.value) or (
        "e.g. 30 or 33" in str(error.value)
    )


def test_a_global_batch_that_divides_or_is_unknown_passes():
    batched = tf.data.Dataset.from_tensor_slices(np.zeros((96, 2))).batch(48)
    for x, batch_size in (
        (np.zeros((96, 2)), 48),
        (batched, None),
        (batched.map(lambda x: x * 2), None),  # tf.data cannot tell.
    ):
        agreement.check_global_batch(topology(workers=3), x, batch_size)


def test_a_worker_that_was_not_there_starts_its_period_from_the_centers():
    model = agn_model()
    fit(model, epochs=2)  # Step 6: mid-period.
    optimizer = model.optimizer
    kernel = model.trainable_weights[0]
    center = optimizer.global_center_variable(kernel)
    assert not np.allclose(kernel.numpy(), center.numpy())
    inner = [v.numpy() for v in optimizer.inner_optimizer.variables]
    optimizer.trainer_seams.restore_worker_state(None, None, replicas_before=2)
    for variable in model.trainable_weights:
        center = optimizer.global_center_variable(variable)
        np.testing.assert_array_equal(variable.numpy(), center.numpy())
        accumulator = optimizer.grad_variable(variable)
        np.testing.assert_array_equal(accumulator.numpy(), 0)
    for variable, before in zip(optimizer.inner_optimizer.variables, inner):
        np.testing.assert_array_equal(variable.numpy(), before)


def test_a_worker_that_stays_scales_its_accumulators_to_the_workers_now():
    # Its accumulators hold its gradients divided by the 2 workers of the
    # backup; on 1, their sum over the replicas is its own mean.
    model = agn_model()
    fit(model, epochs=2)
    optimizer = model.optimizer
    kinds, arrays = optimizer.trainer_seams.worker_state()
    kernel = model.trainable_weights[0]
    before = optimizer.grad_variable(kernel).numpy()
    optimizer.trainer_seams.restore_worker_state(
        kinds, arrays, replicas_before=2
    )
    np.testing.assert_allclose(
        optimizer.grad_variable(kernel).numpy(), 2 * before, rtol=1e-7
    )


def test_a_workers_state_of_another_optimizer_is_refused():
    model = agn_model()
    fit(model, epochs=1)
    kinds, arrays = model.optimizer.trainer_seams.worker_state()
    with pytest.raises(ValueError, match="does not fit its AGNOptimizer"):
        model.optimizer.trainer_seams.restore_worker_state(
            kinds[1:], arrays[1:], 1
        )


# Each kind of inner state: none, slots with a count (SGD's momentum and
# AdamW's are slots as Adam's), and a rule of its own.
INNER = {
    "sgd": lambda: keras.optimizers.SGD(0.05),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "schedule_free": lambda: keras.optimizers.ScheduleFreeAdamW(0.01),
}


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("inner", list(INNER))
def test_a_workers_own_state_comes_back_over_the_chiefs_weights(
    tmp_path, inner, overlap
):
    # Two "workers" (models) train on different data, DiLoCo, mid-period
    # (with overlap, a commit in flight). Worker 1 loads the chief's
    # weights, as Keras restores them, then its own state: every variable
    # it holds of its own is its own again, to the bit, and the rest is
    # the chief's. tests/test_multi_worker.py resumes AdamW and
    # ScheduleFreeAdamW across processes.
    def model():
        return agn_model(
            communication_period=2 if overlap else 4,
            commit="weight_change",
            normalize=False,
            overlap=overlap,
            optimizer=INNER[inner](),
        )

    class Capture(keras.callbacks.Callback):
        """At the last epoch's end (before `fit` applies a commit in
        flight): the weights file, what the worker holds of its own, and
        every value."""

        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                optimizer = self.model.optimizer
                self.model.save_weights(tmp_path / f"{id(self)}.weights.h5")
                self.path = tmp_path / f"{id(self)}.weights.h5"
                self.state = optimizer.trainer_seams.worker_state()
                self.phase = int(optimizer.in_flight_phase)
                self.values = [
                    v.numpy() for v in optimizer.variables + self.model.weights
                ]

    chief, worker = model(), model()
    at_chief, at_worker = Capture(), Capture()
    x, y = data(48)
    chief.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[at_chief])
    worker.fit(
        x + 1, y, batch_size=16, epochs=2, verbose=0, callbacks=[at_worker]
    )
    assert at_worker.phase != 0 if overlap else at_worker.phase == 0
    worker.load_weights(at_chief.path)
    worker.optimizer.trainer_seams.restore_worker_state(
        *at_worker.state, replicas_before=1
    )
    restored = worker.optimizer.variables + worker.weights
    differs = 0
    for variable, mine, chiefs in zip(
        restored, at_worker.values, at_chief.values
    ):
        if np.array_equal(mine, chiefs):
            continue
        differs += 1
        value = variable.numpy()
        assert np.array_equal(value, mine) or np.array_equal(value, chiefs)
        ours = np.array_equal(value, mine)
        assert ours == _is_own(worker.optimizer, variable), variable.path
    assert differs


def _is_own(optimizer, variable):
    """Whether `variable` is one a worker holds of its own: the model's
    trainable weights, the inner optimizer's, and AGN's period starts,
    commits in flight, accumulators and skip counters."""
    own_names = ("period_start", "in_flight", "grad_accumulator", "skipped")
    return (
        any(variable is v for v in optimizer.inner_optimizer.variables)
        or variable.trainable
        or any(name in variable.path for name in own_names)
    )


def test_a_corrupt_backup_falls_back_to_the_previous_with_its_own_state(
    tmp_path, capsys
):
    # Keras's `double_checkpoint`: the weights of epoch 2 are unreadable,
    # so Keras restores epoch 1's; the state files of that step are kept.
    def double():
        callback = keras.callbacks.BackupAndRestore(
            str(tmp_path), double_checkpoint=True
        )
        return WorkerBackup(callback, topology(), str(tmp_path))

    with pytest.raises(RuntimeError, match="interrupted"):
        fit(agn_model(), double(), InterruptAtEpoch(2))
    (tmp_path / "latest.weights.h5").write_bytes(b"not an HDF5 file")
    resumed = agn_model()
    fit(resumed, double(), epochs=2)
    assert (
        "at epoch 2 (optimizer step 3), made on 1 worker, resumed on 1"
        in capsys.readouterr().out
    )
    assert int(resumed.optimizer.iterations) == 6


def test_a_subclass_of_backup_and_restore_is_refused_across_workers(
    tmp_path,
):
    class Mine(keras.callbacks.BackupAndRestore):
        pass

    with pytest.raises(TypeError, match="Received: Mine. Pass `keras"):
        for_this_worker(Mine(str(tmp_path)), topology(), str(tmp_path))
    plain = keras.callbacks.BackupAndRestore(str(tmp_path))
    ours = for_this_worker(plain, topology(), str(tmp_path))
    assert isinstance(ours, WorkerBackup)


def test_restore_worker_state_checks_its_arguments():
    model = agn_model()
    fit(model, epochs=1)
    optimizer = model.optimizer
    kinds, arrays = optimizer.trainer_seams.worker_state()
    for wrong in (0, 1.5, True, "2"):
        with pytest.raises(ValueError, match="`replicas_before` must be"):
            optimizer.trainer_seams.restore_worker_state(kinds, arrays, wrong)
    with pytest.raises(ValueError, match="Received 3 kinds for"):
        optimizer.trainer_seams.restore_worker_state(kinds[:3], arrays, 1)
    with pytest.raises(ValueError, match="Received None kinds for"):
        optimizer.trainer_seams.restore_worker_state(None, arrays, 1)


def test_a_lone_worker_without_tf_config_is_worker_0(tmp_path):
    stand_in = topology()
    stand_in.cluster_resolver.task_id = None  # No TF_CONFIG.
    callback = keras.callbacks.BackupAndRestore(str(tmp_path))
    assert WorkerBackup(callback, stand_in, str(tmp_path)).worker == 0


def test_state_files_of_later_steps_are_removed_at_a_save(tmp_path):
    # Left by a run that went further before this one resumed earlier:
    # they must not crowd out this run's previous step.
    (tmp_path / STATE_DIRECTORY).mkdir(parents=True)
    stale = tmp_path / STATE_DIRECTORY / "step_99.worker_0_of_1.npz"
    stale.write_bytes(b"")
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(agn_model(), backup(tmp_path), InterruptAtEpoch(2))
    assert sorted(os.listdir(tmp_path / STATE_DIRECTORY)) == [
        "step_3.worker_0_of_1.npz",
        "step_6.worker_0_of_1.npz",
    ]


def test_without_agn_only_the_chiefs_stamp_is_needed(tmp_path, capsys):
    # Synchronous training saves no worker state: a backup whose other
    # worker's stamp is missing resumes, and says on how many it was made.
    def sgd_model():
        model = mlp(extra_losses=False)
        model.compile(
            keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy"
        )
        return model

    with pytest.raises(RuntimeError, match="interrupted"):
        fit(sgd_model(), backup(tmp_path, workers=2), InterruptAtEpoch(2))
    fit(sgd_model(), backup(tmp_path, workers=2), epochs=3)
    assert "made on 2 workers, resumed on 2." in capsys.readouterr().out


def test_a_backup_directory_that_cannot_be_made_is_refused_before_training(
    tmp_path,
):
    # Under a file: Keras's own save would fail only after the first epoch.
    (tmp_path / "a_file").write_text("")
    directory = tmp_path / "a_file" / "backup"
    model = agn_model()
    with pytest.raises(ValueError) as raised:
        fit(model, backup(directory))
    assert str(raised.value).startswith(
        f"`BackupAndRestore` cannot write its backup in {str(directory)!r}: "
        "making "
    )
    assert "Pass a `backup_dir` that every worker can create" in str(
        raised.value
    )
    assert int(model.optimizer.iterations.numpy()) == 0


def interrupted_backup(directory):
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(agn_model(), backup(directory), InterruptAtEpoch(2))


def test_unreadable_metadata_is_named_with_what_to_do(tmp_path):
    interrupted_backup(tmp_path)
    path = tmp_path / "training_metadata.json"
    path.write_text('{"epoch": 2, "ba')  # Cut short.
    with pytest.raises(ValueError) as raised:
        fit(agn_model(), backup(tmp_path))
    message = str(raised.value)
    assert message.startswith(
        f"The backup in {str(tmp_path)!r} cannot be read: {str(path)!r} is "
        "not JSON (JSONDecodeError: "
    )
    assert message.endswith("or remove it to start training over.")


def test_a_workers_file_cut_short_is_named_with_what_to_do(tmp_path):
    interrupted_backup(tmp_path)
    path = tmp_path / STATE_DIRECTORY / "step_6.worker_0_of_1.npz"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError) as raised:
        fit(agn_model(), backup(tmp_path))
    assert str(raised.value).startswith(
        f"The backup in {str(tmp_path)!r} cannot be read: {str(path)!r} is "
        "not a worker's state (BadZipFile: "
    )


def test_a_backup_of_another_model_says_so_in_one_line(tmp_path):
    interrupted_backup(tmp_path)
    keras.utils.set_random_seed(1)
    other = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(5), keras.layers.Dense(3)]
    )
    other.compile(
        keras_clones.AGNOptimizer(keras.optimizers.AdamW(0.01), 4), "mse"
    )
    with pytest.raises(ValueError) as raised:
        fit(other, backup(tmp_path))
    message = str(raised.value)
    assert message.startswith(
        f"The backup in {str(tmp_path)!r} was made by another model or "
        "optimizer: its variables do not match this model's (Keras said: "
    )
    assert "\n" not in message


def test_another_rule_is_refused_at_a_resume(tmp_path):
    interrupted_backup(tmp_path)
    with pytest.raises(ValueError) as raised:
        fit(agn_model(normalize=False), backup(tmp_path))
    assert str(raised.value).startswith(
        f"The backup in {str(tmp_path)!r} was made with commit='gradients', "
        "normalize=True, and this AGNOptimizer has commit='gradients', "
        "normalize=False: "
    )


def test_another_period_in_the_middle_of_a_period_is_refused(tmp_path):
    interrupted_backup(tmp_path)  # Period 4, the backup at local step 6.
    with pytest.raises(ValueError) as raised:
        fit(agn_model(communication_period=2), backup(tmp_path))
    assert str(raised.value).startswith(
        f"The backup in {str(tmp_path)!r} was made with "
        "communication_period=4 at local step 6, and this AGNOptimizer has "
        "communication_period=2. The period can change only where one ends"
    )


def test_another_period_at_a_periods_end_resumes_and_says_so(tmp_path, capsys):
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(
            agn_model(communication_period=3),
            backup(tmp_path),
            InterruptAtEpoch(2),
        )
    resumed = agn_model(communication_period=2)
    fit(resumed, backup(tmp_path), epochs=3)
    assert (
        "made on 1 worker, resumed on 1: worker 0 keeps its own state; "
        "communication_period is now 2 (it was 3)."
    ) in capsys.readouterr().out
    assert int(resumed.optimizer.communication_rounds.numpy()) == 2 + 1


@pytest.mark.parametrize("agn", [True, False])
def test_another_global_batch_resumes_and_says_so(tmp_path, capsys, agn):
    # The chief's mark records the global batch `fit` was given (here 16,
    # as `run_as_worker` computes it): a resume at 24 says so.
    def model():
        if agn:
            return agn_model()
        plain = mlp(extra_losses=False)
        plain.compile("adam", "sparse_categorical_crossentropy")
        return plain

    def batch_of(size):
        callback = keras.callbacks.BackupAndRestore(str(tmp_path))
        return WorkerBackup(callback, topology(), str(tmp_path), size)

    with pytest.raises(RuntimeError, match="interrupted"):
        fit(model(), batch_of(16), InterruptAtEpoch(2))
    mark = json.loads((tmp_path / MARK).read_text())
    assert mark == {"workers": 1, "global_batch": 16}
    fit(model(), batch_of(24), epochs=3)
    kept = "worker 0 keeps its own state; " if agn else ""
    assert (
        f"made on 1 worker, resumed on 1: {kept}the global batch is now 24 "
        "(it was 16)."
    ) in capsys.readouterr().out


def test_a_backup_across_workers_without_its_workers_folder_is_refused(
    tmp_path,
):
    # Unlike a backup made in one process, which resumes from the chief's
    # state: the chief's mark says the workers' files belong there.
    interrupted_backup(tmp_path)
    shutil.rmtree(tmp_path / STATE_DIRECTORY)
    with pytest.raises(ValueError) as raised:
        fit(agn_model(), backup(tmp_path))
    assert str(raised.value).startswith(
        f"The backup in {str(tmp_path)!r} was made across workers "
        "(keras_clones_workers.json), but it has no keras_clones_workers/ "
        "files"
    )


def test_a_backup_made_in_one_process_resumes_from_the_chiefs_state(
    tmp_path, capsys
):
    plain = keras.callbacks.BackupAndRestore(str(tmp_path))
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(agn_model(), plain, InterruptAtEpoch(2))
    history = fit(agn_model(), backup(tmp_path))
    assert len(history.epoch) == 3
    assert (
        "at epoch 3 (optimizer step 6), made without worker stamps; on 1 "
        "worker, each from the chief's state."
    ) in capsys.readouterr().out


def sgd_outer():
    return keras.optimizers.SGD(0.7, momentum=0.9)


def test_a_resume_under_other_settings_names_each_with_both_values(tmp_path):
    # Other optimizer variables: Keras leaves them unloaded (or fails), and
    # the refusal names what differs from the worker files' stamp.
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(
            agn_model(outer_optimizer=sgd_outer()),
            backup(tmp_path),
            InterruptAtEpoch(2),
        )
    for options, said in (
        (
            {"communication_dtype": "int4"},
            "communication_dtype=None in the backup, 'int4' here; "
            "error_feedback=False in the backup, True here",
        ),
        ({"fragments": 2}, "fragments=1 in the backup, 2 here"),
        ({"overlap": True}, "overlap=False in the backup, True here"),
    ):
        other = agn_model(outer_optimizer=sgd_outer(), **options)
        with pytest.raises(ValueError) as raised:
            fit(other, backup(tmp_path))
        assert f"; its settings differ: {said}" in str(raised.value)
    # Another outer optimizer whose variables would load: SGD's momentum
    # and RMSprop's velocity, one slot each, by position, meaning other
    # things.
    other = agn_model(outer_optimizer=keras.optimizers.RMSprop(0.01))
    with pytest.raises(ValueError) as raised:
        fit(other, backup(tmp_path))
    assert str(raised.value) == (
        f"The backup in {str(tmp_path)!r} was made with other AGNOptimizer "
        "settings: outer_optimizer='SGD' in the backup, 'RMSprop' here. The "
        "state saved means another thing under each. Resume with the "
        "backup's settings, or remove the directory to start training over."
    )


def test_another_communication_dtype_resumes_and_says_so(tmp_path, capsys):
    interrupted_backup(tmp_path)
    fit(agn_model(communication_dtype="bfloat16"), backup(tmp_path), epochs=3)
    assert (
        "worker 0 keeps its own state; communication_dtype is now "
        "'bfloat16' (it was None)."
    ) in capsys.readouterr().out
