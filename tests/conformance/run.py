"""Runs Keras's own tests with and without keras_clones substituted in.

`make conformance` runs this. For every group of Keras test modules (the
installed ones, under `keras/src/`) it runs pytest once per mode, each in a
process of its own with the `keras_substitution` plugin:

- `baseline`: plain Keras (`--substitute=none`);
- `models`: every `keras.Model` (functional, subclassed, Sequential) is a
  `CloneModel` with 2 clones on 2 logical CPUs;
- `optimizers`: every optimizer the tests construct is wrapped in
  `AGNOptimizer(opt, communication_period=1)`.

It then lists the tests that pass on the baseline and fail with a
substitution (with the first line of their error, grouped by likely cause),
writes `REPORT.md` beside this file and prints it. Tests listed in
`expected_differences.txt` are marked "expected". Exit status: 0 if every
pass->fail is expected, 1 if not, 2 if the baseline itself could not run.

Examples:

    .venv/bin/python tests/conformance/run.py
    .venv/bin/python tests/conformance/run.py --groups models/model_test.py
    .venv/bin/python tests/conformance/run.py --modes optimizers
    .venv/bin/python tests/conformance/run.py --report-only
    .venv/bin/python tests/conformance/run.py --commit HEAD  # a snapshot
"""

import argparse
import collections
import datetime
import fnmatch
import importlib.util
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time
import typing

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
RESULTS = HERE / "results"
REPORT = HERE / "REPORT.md"
EXPECTED = HERE / "expected_differences.txt"

# Runs: the plugin's options for each.
MODES = {
    "baseline": ["--substitute=none"],
    "models": ["--substitute=models"],
    "optimizers": ["--substitute=optimizers"],
    "both": ["--substitute=models,optimizers"],
}
DEFAULT_MODES = ("models", "optimizers")
# A second look at a mode's pass->fail tests: (run, its plugin options, what
# the report says of a test that passes there, and of one that fails).
DIAGNOSES = {
    "models": (
        "models-1clone",
        ["--substitute=models", "--clones=1"],
        "passes with 1 clone",
        "fails with 1 clone too",
    ),
}

# One pytest process per group; paths relative to keras/src, globs allowed.
GROUPS = {
    "models/model_test.py": ["models/model_test.py"],
    "models/functional_test.py": ["models/functional_test.py"],
    "models/sequential_test.py": ["models/sequential_test.py"],
    "trainers/trainer_test.py": ["trainers/trainer_test.py"],
    "saving/saving_lib_test.py": ["saving/saving_lib_test.py"],
    "saving/saving_api_test.py": ["saving/saving_api_test.py"],
    "optimizers/optimizer_test.py": ["optimizers/optimizer_test.py"],
    "optimizers/*_test.py": ["optimizers/*_test.py"],
    "callbacks/*_test.py": ["callbacks/*_test.py"],
}
# Covered by a group of their own, or not run at all (and why).
EXCLUDED = {
    "optimizers/optimizer_test.py": "its own group",
    "callbacks/orbax_checkpoint_test.py": "needs orbax-checkpoint (JAX's "
    "checkpointing), which the conformance extra leaves out",
}


class Cause(typing.NamedTuple):
    """A likely cause: it holds if every given condition does."""

    label: str
    error: str = None  # A regex searched in the first error line.
    id: str = None  # A regex searched in the test id.
    modes: tuple = None  # The substituted runs it applies to.
    recorded: str = None  # A key the plugin recorded ("private_reads", ...).


# Tried in order; the first that holds names the group in the report.
CAUSES = [
    Cause(
        "harness: the test rebased a Keras or keras_clones class for every "
        "later model (the harness restored it)",
        error=r"^harness: ",
    ),
    Cause(
        "options refused by AGN (use_ema, gradient_accumulation_steps, "
        "loss_scale_factor)",
        error=r"AGNOptimizer cannot honour",
    ),
    Cause(
        "Keras's sparse-update check, which patches the assign methods of "
        "the optimizer under test (AGN's inner optimizer does the updates)",
        error=r"calling .assign., .assign_add. or .assign_sub. directly",
    ),
    Cause(
        "test mocks methods of the optimizer under test, which the wrapper "
        "does not call (its inner optimizer does)",
        modes=("optimizers",),
        recorded="mocked",
    ),
    Cause(
        "test reads private attributes of the optimizer under test",
        modes=("optimizers",),
        recorded="private_reads",
    ),
    Cause(
        "CloneModel refused under a tf.distribute strategy with several "
        "replicas",
        error=r"cannot be created under a tf.distribute strategy",
    ),
    Cause(
        "subclass with functional arguments (`super().__init__(inputs, "
        "outputs)`)",
        error=r"__bases__|inheritance cycle|SubclassFunctional",
        modes=("models",),
    ),
    Cause(
        "clone_i_loss entries (fit's logs: History, TensorBoard, ...)",
        error=r"clone_\d_loss",
        modes=("models",),
    ),
    Cause(
        "compute_loss called with `training`",
        error=r"compute_loss\(\) got an unexpected keyword argument",
    ),
    Cause(
        ".h5 / legacy saving",
        error=r"h5|hdf5|HDF5|Unknown layer: 'FunctionalCloneModel'",
    ),
    Cause(
        "variables created in the traced step (model or optimizer built "
        "lazily)",
        error=r"singleton tf.Variables|No gradients provided|not been built|"
        r"unbuilt",
    ),
    Cause(
        "optional (None) inputs",
        error=r"_OptionalImpl|NoneType",
    ),
    Cause(
        "XLA off for several clones (jit_compile)",
        error=r"jit.?compile|XLA",
        modes=("models",),
    ),
    Cause(
        "optimizer under test is an AGNOptimizer: isinstance, class name, "
        "optimizer name or serialized config differ",
        error=r"is not an instance of|AGNOptimizer object|agn_optimizer|"
        r"- AGNOptimizer|'class_name': 'AGNOptimizer'",
        modes=("optimizers",),
    ),
    Cause(
        "attributes or methods of the inner optimizer that AGN does not "
        "forward",
        error=r"'AGNOptimizer' object has no attribute|^AssertionError: "
        r"None != |^NotImplementedError",
        modes=("optimizers",),
    ),
    Cause(
        "AGN's default outer optimizer re-creates the inner one from its "
        "config",
        error=r"unexpected keyword argument 'name'|Pass `outer_optimizer`",
        modes=("optimizers",),
    ),
    Cause(
        "a count differs (optimizer.variables holds AGN's state too)",
        error=r"^AssertionError: \d+ != \d+$",
        modes=("optimizers",),
    ),
    Cause(
        "timeout or crash (did not report)",
        error=r"^Failed: Timeout|did not report",
    ),
]
OTHER = "other (not yet classified)"


def keras_src():
    # Found, not imported: importing Keras would start TensorFlow here.
    spec = importlib.util.find_spec("keras")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("keras is not installed in this Python")
    return pathlib.Path(spec.submodule_search_locations[0]).resolve() / "src"


def group_files(src, name):
    files = []
    for pattern in GROUPS[name]:
        for path in sorted(src.glob(pattern)):
            rel = path.relative_to(src).as_posix()
            if rel in EXCLUDED and pattern != rel:
                continue
            files.append(path)
    return files


def slug(name):
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


def snapshot(commit, into):
    """`keras_clones/` at `commit`, exported to `into`, for PYTHONPATH."""
    archive = subprocess.run(
        ["git", "archive", commit, "keras_clones"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run_group(src, name, run, options, args, pythonpath, ids=None):
    """Runs a group's modules (or only `ids`) in one pytest process."""
    out = RESULTS / run
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / f"{slug(name)}.jsonl"
    log = out / f"{slug(name)}.log"
    jsonl.unlink(missing_ok=True)
    files = group_files(src, name) if ids is None else []
    targets = [str(src / i) for i in ids] if ids is not None else files
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-c",
        str(HERE / "pytest.ini"),
        "--rootdir",
        str(src),
        "-p",
        "keras_substitution",
        *options,
        f"--conformance-json={jsonl}",
        f"--timeout={args.timeout}",
        "-q",
        *map(str, targets),
    ]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(pythonpath),
        KERAS_BACKEND="tensorflow",
        TF_CPP_MIN_LOG_LEVEL="2",
        CUDA_VISIBLE_DEVICES="-1",
    )
    start = time.monotonic()
    status = "ok"
    with open(log, "w") as f:
        f.write(" ".join(command) + "\n\n")
        f.flush()
        try:
            # Not the repository: its `keras_clones/` would shadow a snapshot.
            result = subprocess.run(
                command,
                cwd=out,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=args.group_timeout,
            )
            returncode = result.returncode
        except subprocess.TimeoutExpired:
            returncode = None
            status = f"killed after {args.group_timeout} s"
    seconds = time.monotonic() - start
    if returncode not in (None, 0, 1):
        status = f"pytest exit {returncode}"
    records = load_records(jsonl)
    passed = sum(r["outcome"] == "passed" for r in records.values())
    print(
        f"  {run:<13} {name:<30} {len(records):>4} tests {passed:>4} passed"
        f" {seconds:>6.0f} s  {status}",
        flush=True,
    )
    check = re.search(r"^keras_substitution: (.*)$", log.read_text(), re.M)
    return {
        "seconds": round(seconds, 1),
        "status": status,
        "check": check.group(1) if check else None,
    }


def load_records(path):
    records = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                records[record["id"]] = record
    return records


class Expected(typing.NamedTuple):
    mode: str
    pattern: str  # fnmatch pattern on the test id.
    error: str  # Regex the first error line must match, or None.
    reason: str


def load_expected():
    """The entries of expected_differences.txt."""
    entries = []
    if not EXPECTED.exists():
        return entries
    for number, line in enumerate(EXPECTED.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 2)
        error = None
        if len(parts) == 3 and parts[2].startswith("error~"):
            error, _, reason = parts[2].partition(" ")
            parts[2:] = [reason.strip()]
            error = error[len("error~") :]
        if len(parts) < 3 or not parts[2] or parts[0] not in (*MODES, "*"):
            raise SystemExit(
                f"{EXPECTED.name}:{number}: want `MODE ID [error~REGEX] "
                f"REASON` (MODE one of {', '.join(MODES)} or *): {line!r}"
            )
        entries.append(Expected(parts[0], parts[1], error, parts[2]))
    return entries


def expected_reason(expected, mode, result):
    for entry in expected:
        if (
            entry.mode in ("*", mode)
            and fnmatch.fnmatchcase(result["id"], entry.pattern)
            and (entry.error is None or re.search(entry.error, result["error"]))
        ):
            return entry.reason
    return None


def cause_of(mode, record):
    for cause in CAUSES:
        if (
            (cause.modes is None or mode in cause.modes)
            and (cause.id is None or re.search(cause.id, record["id"]))
            and (cause.error is None or re.search(cause.error, record["error"]))
            and (cause.recorded is None or record.get(cause.recorded))
        ):
            return cause.label
    return OTHER


def module_of(test_id):
    return test_id.split("::", 1)[0]


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                memory = f", {int(line.split()[1]) / 2**20:.0f} GiB RAM"
                break
    except OSError:
        pass
    return (
        f"{platform.machine()}, {cpu}, {os.cpu_count()} cores{memory}, "
        f"{platform.system()} {platform.release()}"
    )


def versions():
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version

    found = [f"Python {platform.python_version()}"]
    for name in ("keras", "tensorflow", "numpy", "jax", "pytest"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} (missing)")
    return ", ".join(found)


def library_state(commit):
    def git(*command):
        return subprocess.run(
            ["git", *command], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()

    if commit:
        short = git("rev-parse", "--short", commit)
        return f"`keras_clones/` exported from commit `{short}`"
    head = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--", "keras_clones")
    state = "with uncommitted changes" if dirty else "clean"
    return f"working tree at commit `{head}` (`keras_clones/` {state})"


def run(args):
    src = keras_src()
    groups = args.groups or list(GROUPS)
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise SystemExit(f"unknown groups {unknown}; known: {list(GROUPS)}")
    modes = ["baseline", *args.modes]
    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(" ", "minutes"),
        "machine": machine(),
        "versions": versions(),
        "library": library_state(args.commit),
        "modes": modes,
        "diagnoses": [],
        "groups": groups,
        "timeout": args.timeout,
        "runs": {},
    }
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        pythonpath = [str(HERE)]
        if args.commit:
            pythonpath.insert(0, str(snapshot(args.commit, pathlib.Path(tmp))))
        for name in groups:
            for mode in modes:
                meta["runs"][f"{mode} {name}"] = run_group(
                    src, name, mode, MODES[mode], args, pythonpath
                )
        for mode in args.modes:
            if mode not in DIAGNOSES or args.no_diagnoses:
                continue
            run, options, _, _ = DIAGNOSES[mode]
            meta["diagnoses"].append(run)
            failed = pass_to_fail(meta, mode)
            for name in groups:
                modules = {
                    m.relative_to(src).as_posix()
                    for m in group_files(src, name)
                }
                ids = sorted(i for i in failed if module_of(i) in modules)
                if ids:
                    meta["runs"][f"{run} {name}"] = run_group(
                        src, name, run, options, args, pythonpath, ids
                    )
                else:
                    (RESULTS / run / f"{slug(name)}.jsonl").unlink(
                        missing_ok=True
                    )
    meta["seconds"] = round(time.monotonic() - start)
    (RESULTS / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def load_run(meta, run):
    """Every record of `run` (a mode or a diagnosis), by test id."""
    records = {}
    for name in meta["groups"]:
        records.update(load_records(RESULTS / run / f"{slug(name)}.jsonl"))
    return records


def pass_to_fail(meta, mode):
    """The tests that pass on the baseline and not in `mode`, by id."""
    baseline = load_run(meta, "baseline")
    got = load_run(meta, mode)
    failed = {}
    for test_id, record in baseline.items():
        if record["outcome"] != "passed":
            continue
        result = got.get(test_id)
        if result is None:
            result = {
                "id": test_id,
                "outcome": "missing",
                "when": "",
                "error": "did not report (its pytest process crashed, was "
                "killed or stopped early)",
            }
        if result["outcome"] != "passed":
            failed[test_id] = result
    return failed


def describe(result):
    """The first error line, as the report shows it."""
    error = result["error"]
    if result["outcome"] == "skipped":
        error = f"skipped: {error}"
    if result["when"] in ("setup", "teardown"):
        error = f"[{result['when']}] {error}"
    return error


def report(meta):
    """REPORT.md's text, and the exit status."""
    expected = load_expected()
    src = keras_src()
    modes = [m for m in meta["modes"] if m != "baseline"]
    baseline = load_run(meta, "baseline")
    records = {mode: load_run(meta, mode) for mode in modes}
    modules = sorted(
        {
            f.relative_to(src).as_posix()
            for name in meta["groups"]
            for f in group_files(src, name)
        }
    )
    status = 0
    broken = [
        f"{key}: {run['status']}"
        for key, run in meta["runs"].items()
        if run["status"] != "ok" and key.startswith("baseline")
    ]
    broken += [
        f"{r['id']}: {r['error']}"
        for r in baseline.values()
        if r["when"] == "collect"
    ]
    if broken:
        status = 2

    differences = {}
    for mode in modes:
        diagnosis = DIAGNOSES.get(mode)
        second = None
        if diagnosis and diagnosis[0] in meta.get("diagnoses", ()):
            second = load_run(meta, diagnosis[0])
        items = []
        for test_id, result in pass_to_fail(meta, mode).items():
            item = dict(result)
            item["expected"] = expected_reason(expected, mode, result)
            item["cause"] = cause_of(mode, result)
            item["note"] = ""
            if second is not None and test_id in second:
                passes = second[test_id]["outcome"] == "passed"
                item["note"] = diagnosis[2] if passes else diagnosis[3]
                if item["cause"] == OTHER:
                    item["cause"] = f"other, {item['note']}"
            items.append(item)
        differences[mode] = items

    per_mode = collections.Counter()
    for key, run in meta["runs"].items():
        per_mode[key.split(" ", 1)[0]] += run["seconds"]
    timing = ", ".join(f"{m} {s / 60:.0f} min" for m, s in per_mode.items())
    excluded = [
        f"`{m}` ({why})"
        for m, why in EXCLUDED.items()
        if why != "its own group"
    ]
    lines = [
        "# Keras's own tests with keras_clones substituted in",
        "",
        "Written by `tests/conformance/run.py` (`make conformance`); do not "
        "edit by hand.",
        "",
        f"- Date: {meta['date']}.",
        f"- Machine: {meta['machine']}.",
        f"- Software: {meta['versions']}.",
        f"- Library: {meta['library']}.",
        f"- Runs: {', '.join(meta['modes'])}; one pytest process per group "
        f"of modules and run, `--timeout={meta['timeout']}` per test; "
        f"{meta['seconds'] / 60:.0f} min in all ({timing}).",
        "- `models`: every `keras.Model` (functional, subclassed, "
        "Sequential) is a `CloneModel` with 2 clones on `/cpu:0`, `/cpu:1`. "
        "`optimizers`: every optimizer the tests construct is "
        "`AGNOptimizer(opt, communication_period=1)`. Both runs, and the "
        "baseline, see the CPU split into 2 logical devices.",
        "- pass->fail: passes on the baseline, fails (or errs, is skipped, or "
        "does not report) with the substitution; the first line of its error "
        "follows it. Causes are guessed from that line and from what the "
        "plugin saw (private attributes a test reads, methods it mocks). "
        "With `models`, the pass->fail tests run again with 1 clone: "
        '"passes with 1 clone" points at splitting the batch, "fails '
        'with 1 clone too" at CloneModel itself. Expected ones are listed '
        "in `expected_differences.txt` with their reason.",
    ]
    if excluded:
        lines.append(f"- Not run: {'; '.join(excluded)}.")
    checks = collections.defaultdict(set)
    for key, run in meta["runs"].items():
        checks[key.split(" ", 1)[0]].add(run.get("check") or "not seen")
    for run, seen in checks.items():
        lines.append(
            f"- What `{run}` built, checked in each of its processes: "
            f"{' / '.join(sorted(seen))}."
        )
    lines.append("")
    if broken:
        lines += ["**The baseline did not run cleanly:**", ""]
        lines += [f"- {b}" for b in broken] + [""]

    header = "| module | tests | baseline pass |"
    rule = "|---|---:|---:|"
    for mode in modes:
        header += f" {mode} pass | {mode} pass->fail (expected) |"
        rule += "---:|---:|"
    lines += ["## Counts", "", header, rule]
    for module in modules + [None]:
        if module is None:
            ids = list(baseline)
            row = "| **all** |"
        else:
            ids = [i for i in baseline if module_of(i) == module]
            row = f"| `{module}` |"
        base_pass = sum(baseline[i]["outcome"] == "passed" for i in ids)
        row += f" {len(ids)} | {base_pass} |"
        for mode in modes:
            passed = sum(
                records[mode].get(i, {}).get("outcome") == "passed" for i in ids
            )
            wanted = set(ids)
            diff = [d for d in differences[mode] if d["id"] in wanted]
            exp = sum(d["expected"] is not None for d in diff)
            row += f" {passed} | {len(diff)} ({exp}) |"
        lines.append(row)
    lines.append("")

    for mode in modes:
        unexpected = [d for d in differences[mode] if d["expected"] is None]
        if unexpected and status == 0:
            status = 1
        lines += [
            f"## pass->fail with `{mode}`: {len(differences[mode])} "
            f"({len(unexpected)} unexpected)",
            "",
        ]
        by_cause = collections.defaultdict(list)
        for d in differences[mode]:
            by_cause[d["cause"]].append(d)
        lines += ["| likely cause | tests | expected |", "|---|---:|---:|"]
        order = sorted(by_cause, key=lambda c: (-len(by_cause[c]), c))
        for cause in order:
            exp = sum(d["expected"] is not None for d in by_cause[cause])
            lines.append(f"| {cause} | {len(by_cause[cause])} | {exp} |")
        lines.append("")
        for cause in order:
            items = sorted(by_cause[cause], key=lambda d: d["id"])
            lines += [f"### {cause} ({len(items)})", ""]
            for d in items:
                notes = []
                if d.get("private_reads"):
                    notes.append(f"reads {', '.join(d['private_reads'])}")
                if d.get("mocked"):
                    notes.append(f"mocks {', '.join(d['mocked'])}")
                if d["note"]:
                    notes.append(d["note"])
                if d["expected"]:
                    notes.append(f"expected: {d['expected']}")
                note = f" ({'; '.join(notes)})" if notes else ""
                lines.append(f"- `{d['id']}`{note}")
                lines.append(f"  - {_clip(describe(d))}")
            lines.append("")
        improved = [
            i
            for i, r in baseline.items()
            if r["outcome"] in ("failed", "error")
            and records[mode].get(i, {}).get("outcome") == "passed"
        ]
        if improved:
            lines += [f"fail->pass with `{mode}`: {len(improved)}", ""]
            lines += [f"- `{i}`" for i in sorted(improved)] + [""]

    stale = sorted(
        f"{entry.mode} {entry.pattern}"
        for entry in expected
        if not any(
            d["expected"] == entry.reason
            and fnmatch.fnmatchcase(d["id"], entry.pattern)
            for m in modes
            if entry.mode in ("*", m)
            for d in differences[m]
        )
    )
    if stale:
        lines += [
            f"## Listed as expected but no longer failing: {len(stale)}",
            "",
            "Remove them from `expected_differences.txt`.",
            "",
        ]
        lines += [f"- `{s}`" for s in stale] + [""]

    failing = sorted(
        (r for r in baseline.values() if r["outcome"] in ("failed", "error")),
        key=lambda r: r["id"],
    )
    lines += [
        f"## Failing on the baseline: {len(failing)}",
        "",
        "Not compared: Keras's own tests that fail here without any "
        "substitution (missing optional packages, fixtures not shipped).",
        "",
    ]
    lines += [f"- `{r['id']}`: {_clip(describe(r))}" for r in failing]
    lines.append("")
    return "\n".join(lines), status


def _clip(text, limit=240):
    text = text.replace("`", "'")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        default=list(DEFAULT_MODES),
        choices=[m for m in MODES if m != "baseline"],
        help="substituted runs besides the baseline (default: %(default)s)",
    )
    parser.add_argument(
        "--groups",
        nargs="+",
        metavar="GROUP",
        help=f"groups of test modules (default: all): {', '.join(GROUPS)}",
    )
    parser.add_argument(
        "--timeout", type=int, default=300, help="seconds per test"
    )
    parser.add_argument(
        "--group-timeout",
        type=int,
        default=2400,
        help="seconds per pytest process (default: %(default)s)",
    )
    parser.add_argument(
        "--commit",
        help="test `keras_clones/` as of this commit (a `git archive` "
        "snapshot), not the working tree that others may be editing",
    )
    parser.add_argument(
        "--no-diagnoses",
        action="store_true",
        help="do not run pass->fail tests again (with 1 clone)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite the report from the results of the last run",
    )
    parser.add_argument(
        "--report",
        type=pathlib.Path,
        default=REPORT,
        help="where to write the report (default: %(default)s)",
    )
    args = parser.parse_args()
    if args.report_only:
        meta = json.loads((RESULTS / "run.json").read_text())
    else:
        meta = run(args)
    text, status = report(meta)
    args.report.write_text(text)
    print(text)
    print(f"Report written to {args.report}.")
    sys.exit(status)


if __name__ == "__main__":
    main()
