"""The wheel is the package: built without the network, installed offline
into a fresh venv, it imports from there and trains as the source does."""

import os
import pathlib
import subprocess
import sys
import sysconfig
import zipfile

import keras_clones

ROOT = pathlib.Path(__file__).parent.parent
PURELIB = "import sysconfig; print(sysconfig.get_path('purelib'))"
# A tiny fit: 2 clones, AGN every 2 steps; prints where keras_clones came
# from, its version, and the weights after 4 steps.
FIT = """
import os
os.environ["KERAS_BACKEND"] = "tensorflow"
import keras, numpy as np, tensorflow as tf, keras_clones
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)
print(keras_clones.__file__)
print(keras_clones.__version__)
keras.utils.set_random_seed(0)
x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int32")
inputs = keras.Input((4,))
outputs = keras.layers.Dense(2, activation="softmax")(inputs)
deployment = keras_clones.DeploymentConfig(devices=["/cpu:0", "/cpu:1"])
model = keras_clones.CloneModel(inputs, outputs, deployment=deployment)
model.compile(
    optimizer=keras_clones.AGNOptimizer(keras.optimizers.SGD(0.1), 2),
    loss="sparse_categorical_crossentropy",
)
model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
print(np.concatenate([w.ravel() for w in model.get_weights()]).tolist())
"""


def run(python, cwd):
    """Runs FIT with `python` in `cwd`; its lines of output."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [str(python), "-c", FIT],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


def test_the_wheel_installs_offline_and_trains_as_the_source(tmp_path):
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(dist), str(ROOT)],
        check=True,
        timeout=120,
    )
    (wheel,) = dist.glob("keras_clones-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(
            f"keras_clones-{keras_clones.__version__}.dist-info/METADATA"
        ).decode()
    assert {name.split("/")[0] for name in names} == {
        "keras_clones",
        f"keras_clones-{keras_clones.__version__}.dist-info",
    }
    assert "keras_clones/cost_model/__main__.py" in names
    assert "Description-Content-Type: text/markdown" in metadata
    assert (ROOT / "README.md").read_text().splitlines()[0] in metadata

    # A venv of the Python under this one, which sees this venv's packages
    # (Keras, TensorFlow) through a .pth file, but not its editable
    # keras_clones: that finder is a .pth file of a site directory.
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages"]
        + ["--without-pip", str(venv)],
        check=True,
        timeout=60,
    )
    python = venv / "bin" / "python"
    subprocess.run(
        [*pip, "--python", str(python), "install", "-q", "--no-deps"]
        + ["--no-index", str(wheel)],
        check=True,
        timeout=120,
    )
    site = subprocess.run(
        [str(python), "-c", PURELIB],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    packages = sysconfig.get_path("purelib")
    pathlib.Path(site, "test_venv_packages.pth").write_text(packages + "\n")

    installed = run(python, tmp_path)
    source = run(sys.executable, tmp_path)
    assert installed[0].startswith(str(venv))
    assert source[0].startswith(str(ROOT))
    assert installed[1] == keras_clones.__version__
    assert installed[2] == source[2]
