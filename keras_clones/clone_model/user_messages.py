"""What a `CloneModel` says alike on both backends: the legacy HDF5
format's refusal, and the warning where its clone devices are missing."""

import warnings


def refuse_legacy_h5(filepath):
    """Raises `ValueError` where `filepath` names the legacy HDF5 format,
    which keeps neither the model's class nor its deployment."""
    if str(filepath).endswith((".h5", ".hdf5")):
        raise ValueError(
            "CloneModel cannot be saved in the legacy HDF5 format, which "
            "keeps neither its class nor its deployment. Save it in the "
            "Keras format instead: `model.save('model.keras')`. "
            f"Received: filepath={filepath!r}."
        )


def warn_missing_devices(missing, served_on, stacklevel):
    """Warns that the clone devices `missing` (names) do not exist here,
    so that `evaluate` and `predict` run on `served_on` (names) instead;
    `stacklevel` as the caller's."""
    warnings.warn(
        f"This CloneModel's clone devices {', '.join(missing)} do not exist "
        f"on this machine: `evaluate` and `predict` run on "
        f"{', '.join(served_on)} instead, with the same results (`fit` "
        "refuses to train there). To choose the devices, set "
        "`model.deployment = keras_clones.DeploymentConfig(devices=[...])`.",
        stacklevel=stacklevel + 1,
    )
