"""The first example of each page a user starts from runs as written,
given the data and model it leaves to the reader (`x`, `y`, `inputs`,
`outputs`, `model`): the README's, and docs/agn.md's, clone_model.md's and
callbacks.md's. The pages across processes start a launch; their examples
run in tests/test_examples.py as whole scripts."""

import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent
# What a page leaves to its reader, on a CPU split in two: its GPUs are
# those two devices.
PRELUDE = """
import os
os.environ["KERAS_BACKEND"] = "tensorflow"
import numpy as np, tensorflow as tf, keras, keras_clones
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 64)).astype("float32")
y = rng.integers(0, 10, size=512)
inputs = keras.Input((64,))
outputs = keras.layers.Dense(10, activation="softmax")(inputs)
model = keras_clones.CloneModel(inputs, outputs)
model.compile("adam", "sparse_categorical_crossentropy")
"""
# Runs each example in a namespace of its own; prints the losses it fit.
RUN = """
import json, sys
examples = json.loads(sys.argv[1])
prelude = {}
exec(compile(PRELUDE, "prelude", "exec"), prelude)
for name, code in examples.items():
    scope = dict(prelude)
    exec(compile(code, name, "exec"), scope)
    loss = scope["model"].history.history["loss"]
    print("LOSS", json.dumps([name, loss]))
"""


def first_python_example(page, index=0):
    """The `index`-th ```python block of `page` (a path under ROOT)."""
    text = (ROOT / page).read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S)
    return blocks[index].replace("/gpu:", "/cpu:")


def test_the_first_examples_of_the_readme_and_the_pages_run(tmp_path):
    examples = {
        "README.md": first_python_example("README.md"),
        "README.md (AGN)": first_python_example("README.md", 1),
        "docs/clone_model.md": first_python_example("docs/clone_model.md"),
        "docs/agn.md": first_python_example("docs/agn.md"),
        "docs/callbacks.md": first_python_example("docs/callbacks.md"),
    }
    result = subprocess.run(
        [sys.executable, "-c", f"PRELUDE = {PRELUDE!r}\n{RUN}"]
        + [json.dumps(examples)],
        cwd=tmp_path,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    losses = dict(
        json.loads(line[len("LOSS ") :])
        for line in result.stdout.splitlines()
        if line.startswith("LOSS ")
    )
    assert sorted(losses) == sorted(examples)
    for name, (loss,) in losses.items():  # One epoch each.
        assert 0 < loss < 10, name
