"""pytest plugin: runs Keras's own tests with keras_clones substituted in.

Loaded by `run.py` as `pytest -p keras_substitution --substitute=MODE`:

- `none`: the baseline, plain Keras (on the same 2 logical CPUs).
- `models`: every `keras.Model` the tests build is a `CloneModel` with two
  clones on `/cpu:0` and `/cpu:1`: `Model(inputs, outputs)` is a functional
  CloneModel, `Model()` a CloneModel, a `class M(Model)` defined in a test
  module is rebased onto `CloneModel`, and `Sequential` itself is rebased
  onto `CloneModel`. A CloneModel created without `deployment=` gets the two
  clones (`--clones=1`: one). `Functional(...)` called directly (Keras
  internals, a few tests) stays plain.
- `optimizers`: every Keras optimizer the tests construct (`Adam(...)`,
  `optimizers.get("adam")`, a deserialized config, a test's own subclass) is
  returned wrapped as `AGNOptimizer(opt, communication_period=1)`; the base
  class `Optimizer(...)` itself is not. The private attributes of an
  AGNOptimizer that a test's own code reads, and those that `unittest.mock`
  patches, are recorded with its result.
  `LossScaleOptimizer` and `MultiOptimizer` are left as they are (the
  optimizers they wrap are wrapped), as is what `AGNOptimizer` builds or
  deserializes itself.
- `models,optimizers`: both.

Whatever the mode, the CPU is split into 2 logical devices before
TensorFlow starts, and one JSON line per test (id, outcome, first error
line) is appended to `--conformance-json`.
"""

import functools
import json
import os
import sys
import types

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

DEVICES = ["/cpu:0", "/cpu:1"]

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * len(DEVICES),
)

import keras  # noqa: E402
from keras.src.models.functional import Functional  # noqa: E402
from keras.src.models.model import functional_init_arguments  # noqa: E402

import keras_clones  # noqa: E402
from keras_clones.clone_model.model import CloneModel  # noqa: E402
from keras_clones.clone_model.model import FunctionalCloneModel  # noqa: E402

Model = keras.Model
Sequential = keras.Sequential
Optimizer = keras.optimizers.Optimizer
LossScaleOptimizer = keras.optimizers.LossScaleOptimizer
MultiOptimizer = keras.optimizers.MultiOptimizer

MODES = ("models", "optimizers")

# Classes whose bases the tests must not change (Keras's functional-subclass
# detection rebases a class's ancestors onto `Functional`).
_GUARDED_BASES = {}


def _skip_if_backend(given_backend, reason):
    return pytest.mark.skipif(
        keras.backend.backend() == given_backend, reason=reason
    )


def _provide_keras_conftest():
    """`from conftest import skip_if_backend`, as Keras's repository has."""
    if "conftest" not in sys.modules:
        shim = types.ModuleType("conftest")
        shim.skip_if_backend = _skip_if_backend
        sys.modules["conftest"] = shim


def _in_test_module(cls):
    return cls.__module__.rsplit(".", 1)[-1].endswith("_test")


def substitute_models(clones=len(DEVICES)):
    original_init = CloneModel.__init__
    devices = DEVICES[:clones]

    @functools.wraps(original_init)
    def clone_model_init(self, *args, deployment=None, **kwargs):
        if deployment is None:
            deployment = keras_clones.DeploymentConfig(devices=devices)
        original_init(self, *args, deployment=deployment, **kwargs)

    CloneModel.__init__ = clone_model_init

    original_new = Model.__dict__["__new__"]
    original_new = getattr(original_new, "__func__", original_new)

    def model_new(cls, *args, **kwargs):
        if cls is Model:
            if functional_init_arguments(args, kwargs):
                target = FunctionalCloneModel
            else:
                target = CloneModel
            return target.__new__(target, *args, **kwargs)
        return original_new(cls, *args, **kwargs)

    Model.__new__ = staticmethod(model_new)

    def init_subclass(cls, **kwargs):
        super(Model, cls).__init_subclass__(**kwargs)
        if _in_test_module(cls) and Model in cls.__bases__:
            cls.__bases__ = tuple(
                CloneModel if base is Model else base for base in cls.__bases__
            )

    Model.__init_subclass__ = classmethod(init_subclass)

    Sequential.__bases__ = (CloneModel,)


_wrapping = 0  # > 0 while the optimizers constructed stay unwrapped.
# Private attributes of an AGNOptimizer that the current test's own code
# read, and attributes that `unittest.mock` read (to patch them).
_private_reads = set()
_mocked = set()


def _unwrapped(function):
    """`function`, constructing optimizers as they are (AGN's own)."""

    @functools.wraps(function)
    def run(*args, **kwargs):
        global _wrapping
        _wrapping += 1
        try:
            return function(*args, **kwargs)
        finally:
            _wrapping -= 1

    return run


def substitute_optimizers():
    AGNOptimizer = keras_clones.AGNOptimizer
    kept = (AGNOptimizer, LossScaleOptimizer, MultiOptimizer)

    @_unwrapped
    def wrapped(cls, args, kwargs):
        return AGNOptimizer(cls(*args, **kwargs), communication_period=1)

    def optimizer_new(cls, *args, **kwargs):
        # Keras builds a bare `Optimizer(1.0)` to list base attributes.
        if _wrapping or cls is Optimizer or issubclass(cls, kept):
            return object.__new__(cls)
        # Not an instance of `cls`: Python does not call `__init__` again.
        return wrapped(cls, args, kwargs)

    Optimizer.__new__ = staticmethod(optimizer_new)

    getattribute = AGNOptimizer.__getattribute__

    def agn_getattribute(self, name):
        if name[:2] != "__":
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller == "unittest.mock":
                _mocked.add(name)
            elif name[:1] == "_" and caller.endswith("_test"):
                _private_reads.add(name)
        return getattribute(self, name)

    AGNOptimizer.__getattribute__ = agn_getattribute
    from_config = AGNOptimizer.__dict__["from_config"].__func__
    AGNOptimizer.from_config = classmethod(_unwrapped(from_config))


def pytest_addoption(parser):
    group = parser.getgroup("keras_substitution")
    group.addoption(
        "--substitute",
        default="none",
        help="none, or a comma-separated subset of: " + ", ".join(MODES),
    )
    group.addoption(
        "--clones",
        type=int,
        default=len(DEVICES),
        help="clones of a substituted model (default: %(default)s)",
    )
    group.addoption(
        "--conformance-json",
        default=None,
        help="append one JSON line per test to this file",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "requires_trainable_backend: Keras's own marker"
    )
    config.addinivalue_line("markers", "multi_device: Keras's own marker")
    _provide_keras_conftest()
    value = config.getoption("--substitute")
    modes = [] if value == "none" else value.split(",")
    unknown = set(modes) - set(MODES)
    if unknown:
        raise pytest.UsageError(f"--substitute: unknown {sorted(unknown)}")
    clones = config.getoption("--clones")
    if not 1 <= clones <= len(DEVICES):
        raise pytest.UsageError(f"--clones: 1 to {len(DEVICES)}")
    if "models" in modes:
        substitute_models(clones)
    if "optimizers" in modes:
        substitute_optimizers()
    config._conformance_check = check_substitution(modes, clones)
    for cls in (
        CloneModel,
        FunctionalCloneModel,
        Sequential,
        Functional,
        Model,
    ):
        _GUARDED_BASES[cls] = cls.__bases__
    config._conformance = _Recorder(config.getoption("--conformance-json"))
    config.pluginmanager.register(config._conformance, "conformance_recorder")


def check_substitution(modes, clones):
    """What the tests will get, checked once: a line for the header."""
    inputs = keras.Input((2,))
    outputs = keras.layers.Dense(1)(inputs)
    built = {
        "Model(inputs, outputs)": Model(inputs, outputs),
        "Sequential()": Sequential(),
        "optimizers.get('adam')": keras.optimizers.get("adam"),
    }
    found = []
    for what, obj in built.items():
        got = getattr(getattr(obj, "deployment", None), "num_clones", 0)
        kind = f"{got} clones" if got else "not a CloneModel"
        found.append(f"{what} -> {type(obj).__name__} ({kind})")
        if isinstance(obj, keras.optimizers.Optimizer):
            found[-1] = f"{what} -> {type(obj).__name__}"
            wrapped = isinstance(obj, keras_clones.AGNOptimizer)
            if wrapped != ("optimizers" in modes):
                raise pytest.UsageError(f"substitution failed: {found[-1]}")
        elif got != (clones if "models" in modes else 0):
            raise pytest.UsageError(f"substitution failed: {found[-1]}")
    keras.utils.clear_session()
    return "; ".join(found)


def pytest_sessionstart(session):
    # Written even with -q, for run.py to read from the log.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        check = session.config._conformance_check
        reporter.write_line(f"keras_substitution: {check}")


@pytest.fixture(autouse=True)
def _guard_class_bases():
    """Fails (in teardown) a test that rebased CloneModel, Sequential, ..."""
    yield
    changed = []
    for cls, bases in _GUARDED_BASES.items():
        if cls.__bases__ != bases:
            changed.append(
                f"{cls.__name__}.__bases__ became "
                f"{tuple(b.__name__ for b in cls.__bases__)}"
            )
            cls.__bases__ = bases  # So that later tests see the classes.
    if changed:
        pytest.fail(
            "harness: this test changed class hierarchies for every later "
            "model (Keras's functional-subclass detection): "
            + "; ".join(changed),
            pytrace=False,
        )


def _first_line(report):
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple):  # A skip: (path, line, reason).
        return str(longrepr[2]).splitlines()[0] if longrepr[2] else ""
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(longrepr)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    # "AssertionError:" alone says little; numpy puts its message below.
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"
    return lines[0]


class _Recorder:
    """One JSON line per test: its id, outcome and first error line."""

    def __init__(self, path):
        self.path = path
        self.current = {}

    def _write(self, record):
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def pytest_collectreport(self, report):
        if report.failed:
            self._write(
                {
                    "id": report.nodeid,
                    "outcome": "error",
                    "when": "collect",
                    "error": _first_line(report),
                }
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        _private_reads.clear()
        _mocked.clear()

    def pytest_runtest_logreport(self, report):
        record = self.current.setdefault(
            report.nodeid,
            {"id": report.nodeid, "outcome": "passed", "when": "", "error": ""},
        )
        if record["outcome"] == "passed" and not report.passed:
            if report.skipped:
                outcome = "skipped"
            elif report.when == "call":
                outcome = "failed"
            else:
                outcome = "error"
            record.update(
                outcome=outcome, when=report.when, error=_first_line(report)
            )
        if report.when == "teardown":
            record = self.current.pop(report.nodeid)
            if _private_reads:
                record["private_reads"] = sorted(_private_reads)
            if _mocked:
                record["mocked"] = sorted(_mocked)
            self._write(record)
