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
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
RESULTS = HERE / "results"
REPORT = HERE / "REPORT.md"
EXPECTED = HERE / "expected_differences.txt"

MODES = {
    "baseline": "none",
    "models": "models",
    "optimizers": "optimizers",
    "both": "models,optimizers",
}
DEFAULT_MODES = ("models", "optimizers")

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
}

# A cause that holds when the test's own code read private attributes of an
# AGNOptimizer (recorded by the plugin), whatever its error.
PRIVATE_READS = object()

# Likely causes, tried in order: (cause, regex on the first error line,
# regex on the test id or None, modes or None for any).
CAUSES = [
    (
        "harness: the test rebased a class for every later model",
        r"^harness: ",
        None,
        None,
    ),
    (
        "options refused by AGN (use_ema, gradient_accumulation_steps, "
        "loss_scale_factor)",
        r"AGNOptimizer cannot honour",
        None,
        None,
    ),
    (
        "test reads private attributes of the optimizer under test",
        PRIVATE_READS,
        None,
        ("optimizers",),
    ),
    (
        "evaluate/logs/metrics_names carry clone_i_loss entries",
        r"clone_\d_loss",
        None,
        ("models",),
    ),
    (
        "XLA off for several clones (jit_compile)",
        r"jit.?compile|XLA",
        None,
        ("models",),
    ),
    (
        "optimizer under test is an AGNOptimizer, not its class "
        "(isinstance/type/name/config)",
        r"is not an instance of|AGNOptimizer object|agn_optimizer|"
        r"'AGNOptimizer'|class_name",
        None,
        ("optimizers",),
    ),
    (
        "test reads attributes of the optimizer under test that AGN does "
        "not forward",
        r"'AGNOptimizer' object has no attribute|^AssertionError: None != ",
        None,
        ("optimizers",),
    ),
    (
        "AGN set_weights/get_weights needs a built optimizer or another layout",
        r"set_weights|get_weights",
        None,
        ("optimizers",),
    ),
    (
        "optional (None) inputs: fit([None], y) and tf.experimental.Optional",
        r"_OptionalImpl|NoneType|Optional",
        None,
        None,
    ),
    (
        "compute_loss called without `training`",
        r"compute_loss|training",
        None,
        ("models",),
    ),
    (
        ".h5 / legacy saving",
        r"h5|hdf5|HDF5",
        r"h5|hdf5|legacy",
        None,
    ),
    (
        "subclassed model built lazily (no weights before the first step)",
        r"built|has no weights|not been built|unbuilt|build\(",
        None,
        ("models",),
    ),
    (
        "sparse gradients (IndexedSlices)",
        r"IndexedSlices|sparse",
        None,
        None,
    ),
    (
        "tf.Variable / non-Keras variables",
        r"tf\.Variable|ResourceVariable|backend\.Variable",
        None,
        None,
    ),
    (
        "callable or schedule learning rate",
        r"learning_rate|LearningRateSchedule|callable",
        None,
        None,
    ),
    (
        "timeout or crash (did not report)",
        r"^Failed: Timeout|did not report",
        None,
        None,
    ),
    (
        "numerical values differ (assertAllClose)",
        r"Not equal to tolerance|Mismatched elements",
        None,
        None,
    ),
]
OTHER = "other (not yet classified)"


def keras_src():
    import keras

    return pathlib.Path(keras.__file__).resolve().parent / "src"


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


def run_group(src, name, mode, args, pythonpath):
    out = RESULTS / mode
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / f"{slug(name)}.jsonl"
    log = out / f"{slug(name)}.log"
    jsonl.unlink(missing_ok=True)
    files = group_files(src, name)
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
        f"--substitute={MODES[mode]}",
        f"--conformance-json={jsonl}",
        f"--timeout={args.timeout}",
        "-q",
        *map(str, files),
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
        f"  {mode:<10} {name:<30} {len(records):>4} tests {passed:>4} passed"
        f" {seconds:>6.0f} s  {status}",
        flush=True,
    )
    return {"seconds": round(seconds, 1), "status": status, "files": len(files)}


def load_records(path):
    records = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                records[record["id"]] = record
    return records


def load_expected():
    """(mode, id pattern, reason) from expected_differences.txt."""
    entries = []
    if not EXPECTED.exists():
        return entries
    for number, line in enumerate(EXPECTED.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 3 or parts[0] not in (*MODES, "*"):
            raise SystemExit(
                f"{EXPECTED.name}:{number}: want `MODE ID REASON` "
                f"(MODE one of {', '.join(MODES)} or *): {line!r}"
            )
        entries.append(tuple(parts))
    return entries


def expected_reason(expected, mode, test_id):
    for entry_mode, pattern, reason in expected:
        if entry_mode in ("*", mode) and fnmatch.fnmatchcase(test_id, pattern):
            return reason
    return None


def cause_of(mode, record):
    error = record["error"]
    for cause, error_pattern, id_pattern, modes in CAUSES:
        if modes is not None and mode not in modes:
            continue
        if id_pattern is not None and not re.search(id_pattern, record["id"]):
            continue
        if error_pattern is PRIVATE_READS:
            if record.get("private_reads"):
                return cause
        elif re.search(error_pattern, error):
            return cause
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
    with tempfile.TemporaryDirectory() as tmp:
        pythonpath = [str(HERE)]
        if args.commit:
            pythonpath.insert(0, str(snapshot(args.commit, pathlib.Path(tmp))))
        meta = {
            "date": datetime.datetime.now()
            .astimezone()
            .isoformat(" ", "minutes"),
            "machine": machine(),
            "versions": versions(),
            "library": library_state(args.commit),
            "modes": modes,
            "groups": groups,
            "timeout": args.timeout,
            "runs": {},
        }
        start = time.monotonic()
        for name in groups:
            for mode in modes:
                meta["runs"][f"{mode} {name}"] = run_group(
                    src, name, mode, args, pythonpath
                )
        meta["seconds"] = round(time.monotonic() - start)
    (RESULTS / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def report(meta):
    """REPORT.md's text, and the exit status."""
    expected = load_expected()
    src = keras_src()
    modes = [m for m in meta["modes"] if m != "baseline"]
    records = {
        mode: {
            k: v
            for name in meta["groups"]
            for k, v in load_records(
                RESULTS / mode / f"{slug(name)}.jsonl"
            ).items()
        }
        for mode in meta["modes"]
    }
    baseline = records["baseline"]
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
        f"baseline {r['id']}: {r['error']}"
        for r in baseline.values()
        if r["when"] == "collect"
    ]
    if broken:
        status = 2

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
        f"and mode, `--timeout={meta['timeout']}` per test; "
        f"{meta['seconds'] / 60:.0f} min in all.",
        "- `models`: every `keras.Model` (functional, subclassed, "
        "Sequential) is a `CloneModel` with 2 clones on `/cpu:0`, `/cpu:1`. "
        "`optimizers`: every optimizer the tests construct is "
        "`AGNOptimizer(opt, communication_period=1)`. Both runs, and the "
        "baseline, see the CPU split into 2 logical devices.",
        "- pass->fail: passes on the baseline, fails (or errs, is skipped, or "
        "does not report) with the substitution. Expected ones are listed in "
        "`expected_differences.txt` with their reason.",
        "",
    ]
    if broken:
        lines += ["**The baseline did not run cleanly:**", ""]
        lines += [f"- {b}" for b in broken] + [""]

    header = "| module | tests | baseline pass |"
    rule = "|---|---:|---:|"
    for mode in modes:
        header += f" {mode} pass | {mode} pass->fail (expected) |"
        rule += "---:|---:|"
    lines += ["## Counts", "", header, rule]
    totals = collections.Counter()
    differences = {mode: [] for mode in modes}
    for mode in modes:
        for test_id, record in baseline.items():
            if record["outcome"] != "passed":
                continue
            got = records[mode].get(test_id)
            if got is None:
                run_status = "the process did not report this test"
                got = {
                    "id": test_id,
                    "outcome": "missing",
                    "when": "",
                    "error": f"did not report ({run_status})",
                }
            if got["outcome"] == "passed":
                continue
            error = got["error"]
            if got["outcome"] == "skipped":
                error = f"skipped: {error}"
            if got["when"] not in ("call", "", "collect"):
                error = f"[{got['when']}] {error}"
            item = dict(got, error=error)
            item["expected"] = expected_reason(expected, mode, test_id)
            item["cause"] = cause_of(mode, item)
            differences[mode].append(item)
    for module in modules:
        ids = [i for i in baseline if module_of(i) == module]
        base_pass = sum(baseline[i]["outcome"] == "passed" for i in ids)
        row = f"| `{module}` | {len(ids)} | {base_pass} |"
        totals["tests"] += len(ids)
        totals["baseline"] += base_pass
        for mode in modes:
            passed = sum(
                records[mode].get(i, {}).get("outcome") == "passed" for i in ids
            )
            diff = [
                d for d in differences[mode] if module_of(d["id"]) == module
            ]
            exp = sum(d["expected"] is not None for d in diff)
            row += f" {passed} | {len(diff)} ({exp}) |"
            totals[f"{mode} pass"] += passed
            totals[f"{mode} diff"] += len(diff)
            totals[f"{mode} exp"] += exp
        lines.append(row)
    row = f"| **all** | {totals['tests']} | {totals['baseline']} |"
    for mode in modes:
        row += (
            f" {totals[f'{mode} pass']} | {totals[f'{mode} diff']} "
            f"({totals[f'{mode} exp']}) |"
        )
    lines += [row, ""]

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
        # Largest group first.
        for cause in sorted(by_cause, key=lambda c: (-len(by_cause[c]), c)):
            items = sorted(by_cause[cause], key=lambda d: d["id"])
            lines += [f"### {cause} ({len(items)})", ""]
            for d in items:
                mark = f" — expected: {d['expected']}" if d["expected"] else ""
                reads = ", ".join(d.get("private_reads", ()))
                reads = f" (reads {reads})" if reads else ""
                lines.append(f"- `{d['id']}`{reads}{mark}")
                lines.append(f"  - {_clip(d['error'])}")
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

    failing = sorted(
        (r for r in baseline.values() if r["outcome"] in ("failed", "error")),
        key=lambda r: r["id"],
    )
    lines += [f"## Failing on the baseline: {len(failing)}", ""]
    lines += [f"- `{r['id']}`: {_clip(r['error'])}" for r in failing]
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
