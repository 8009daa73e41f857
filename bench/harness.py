"""The benchmarks' harness: each benchmark is a `Benchmark`, a spec of its
flags, its measurement and its report, and `run` gives it the rest: the
command line, `--quick`, its worker mode, JSON records, tables of ratios
and figures.

    BENCHMARK = harness.Benchmark(
        __doc__,
        flags=[harness.Flag("--rounds", 9, quick=2, help="timed rounds")],
        measure=measure,  # args -> records (JSON-able), or None if failed
        report=report,  # (records, args) -> None: prints tables, draws
    )
    if __name__ == "__main__":
        harness.run(BENCHMARK)

Standard library only (matplotlib in `figure`): the drivers of the
multi-worker benchmarks import no Keras. Timing inside `fit` is in
`timing.py`; workers over `keras_clones.launch` start in `launching.py`.
"""

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
# A driver runs itself as its workers with this flag.
WORKER_FLAG = "--worker"


def positive_int(text):
    """An argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text):
    """An argparse type: a number > 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def multiple_of(period):
    """An argparse type: a positive multiple of `period`."""
    return _positive_where(lambda v: v % period == 0, f"a multiple of {period}")


def divisor_of(period):
    """An argparse type: a positive integer that divides `period`."""
    return _positive_where(lambda v: period % v == 0, f"a divisor of {period}")


def _positive_where(holds, what):
    """An argparse type: an integer >= 1 for which `holds`, else "must be
    `what`"."""

    def parse(text):
        value = positive_int(text)
        if not holds(value):
            raise argparse.ArgumentTypeError(f"must be {what}")
        return value

    return parse


@dataclasses.dataclass(frozen=True)
class Flag:
    """A benchmark's flag: `name`, its default, and its default under
    `--quick` (`quick`; the same when None).

    The type is the default's (an int: >= 1; a bool: a switch; a list:
    several of its first item's type) unless `type` says otherwise;
    `choices` and `metavar` are argparse's.
    """

    name: str
    default: object = None
    quick: object = None
    help: str = ""
    type: object = None
    choices: object = None
    metavar: str = None

    def add_to(self, parser):
        sample = self.default if self.default is not None else self.quick
        kwargs = {"help": self._help(), "default": None}
        if isinstance(sample, bool):
            parser.add_argument(self.name, action="store_true", **kwargs)
            return
        if isinstance(sample, (list, tuple)):
            kwargs["nargs"] = "+"
            sample = sample[0] if sample else None
        kind = self.type
        if kind is None and sample is not None:
            kind = positive_int if type(sample) is int else type(sample)
        parser.add_argument(
            self.name,
            type=kind,
            choices=self.choices,
            metavar=self.metavar,
            **kwargs,
        )

    def _help(self):
        if self.default is None or isinstance(self.default, bool):
            return self.help
        default = _shown(self.default)
        if self.quick is None:
            return f"{self.help} (default {default})"
        quick = _shown(self.quick)
        return f"{self.help} (default {default}, {quick} with --quick)"

    def value(self, given, quick):
        if given is not None:
            return given
        if quick and self.quick is not None:
            return self.quick
        return self.default


def _shown(value):
    if value == "":
        return "none"
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A benchmark as a spec.

    Attributes:
        doc: The module's docstring; its first line is `--help`'s.
        measure: `measure(args)`: the run's records (JSON-able), or None
            when it failed (the driver then exits with status 1).
        report: `report(records, args)`: prints the tables, draws the
            figures (into `args.figures` where `record` is set).
        flags: The benchmark's `Flag`s; `--quick` is always there.
        quick: `--quick`'s help: what a smoke run does.
        record: A file name, or a function of the parsed flags to one: the
            records go to `--out`/`record` as JSON, and `--out`,
            `--figures` and `--from-json` are flags.
        worker: `worker(argv)`, run instead when `WORKER_FLAG` is given
            (the benchmark's own workers).
    """

    doc: str
    measure: object
    report: object
    flags: tuple = ()
    quick: str = "a smoke run, in minutes"
    record: str = None
    worker: object = None

    def parse(self, argv):
        parser = argparse.ArgumentParser(
            description=self.doc.strip().splitlines()[0]
        )
        parser.add_argument("--quick", action="store_true", help=self.quick)
        for flag in self.flags:
            flag.add_to(parser)
        if self.record is not None:
            parser.add_argument(
                "--out",
                default=str(ROOT / "bench" / "out"),
                help="where the JSON records go (default bench/out)",
            )
            parser.add_argument(
                "--figures",
                help="where the PNGs go (default bench/figures; with "
                "--quick, --out)",
            )
            parser.add_argument(
                "--from-json",
                metavar="PATH",
                help="print the tables and draw the figures of an earlier "
                "run's records instead of running",
            )
        args = parser.parse_args(argv)
        for flag in self.flags:
            dest = flag.name.lstrip("-").replace("-", "_")
            setattr(args, dest, flag.value(getattr(args, dest), args.quick))
        if self.record is not None and args.figures is None:
            figures = ROOT / "bench" / "figures"
            args.figures = args.out if args.quick else str(figures)
        return args


def run(benchmark, argv=None):
    """Runs `benchmark` as its command line `argv` (default `sys.argv`)
    says: as a worker, from a record, or measured and reported."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if benchmark.worker is not None and WORKER_FLAG in argv:
        benchmark.worker([a for a in argv if a != WORKER_FLAG])
        return
    args = benchmark.parse(argv)
    record = benchmark.record
    if record is None:
        data = benchmark.measure(args)
    else:
        record = record(args) if callable(record) else record
        data = records(args, benchmark.measure, record)
    if data is None:
        sys.exit(1)
    benchmark.report(data, args)


def records(args, measure, filename):
    """The records of `--from-json`, or of `measure(args)` (None if it
    failed), then written to `--out`/`filename`."""
    if args.from_json:
        with open(args.from_json) as f:
            return json.load(f)
    print(machine())
    data = measure(args)
    if data is None:
        return None
    print(f"Wrote {save(args, data, filename)}.")
    return data


def machine():
    """The line that opens a run's output: this Python and its cores."""
    return f"Python {sys.version.split()[0]}, {os.cpu_count()} CPU cores."


def save(args, data, filename):
    """Writes the records `data` to `--out`/`filename`; its path. (A
    benchmark that saves as it goes keeps a stopped run's first parts.)"""
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, filename)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    return path


def round_robin(names, run_once, repeats):
    """Runs each of `names` once per repeat, interleaved (A B C A B C ...)
    so that the machine's noise hits all alike.

    Args:
        names: The variants.
        run_once: `run_once(name, repeat)`: a dict of the run's numbers, or
            None when it failed (the variant is then not run again).
        repeats: How many rounds.

    Returns:
        Per name, its runs: the dicts, each with `"repeat"` added.
    """
    results = {name: [] for name in names}
    failed = set()
    for repeat in range(repeats):
        for name in names:
            if name in failed:
                continue
            result = run_once(name, repeat)
            if result is None:
                failed.add(name)
                continue
            results[name].append(dict(result, repeat=repeat))
    return results


def exit_if_any_failed(results):
    """Exits with status 1 after a report where a variant of `results`
    (`round_robin`'s) has no run: it failed."""
    if any(not runs for runs in results.values()):
        sys.exit(1)


def table(columns, rows, align=None):
    """A markdown table: `columns` its header, `rows` lists of cells
    (formatted strings), `align` one letter per column, "l" or "r"
    (default: the first left, the others right). Ends with a newline."""
    align = align or "l" + "r" * (len(columns) - 1)
    rule = ["---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def figure(path, draw, shape=(1, 1), size=(6.4, 4.8), dpi=100):
    """Draws a figure of `shape` (rows, columns) subplots with
    `draw(fig, axes)`, saves it to `path` and says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig, axes = plt.subplots(*shape, figsize=size)
    draw(fig, axes)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    print(f"Wrote {path}.")
    return path


# Ratios of throughputs measured in repeated runs.

RATIO_HEADER = [
    "| ratio | best-of | median | per-repeat median | goal "
    "| met (best / median / per-repeat) |",
    "|---|---:|---:|---:|---:|---|",
]


def summary(values):
    """Best-of and median: what every benchmark here reports."""
    return max(values), statistics.median(values)


def met(ratios, goal):
    """Whether each of `ratios` reaches `goal`: "yes" or "NO", joined by
    " / "."""
    return " / ".join("yes" if r >= goal else "NO" for r in ratios)


def ratios_of(top, bottom, key):
    """The ratios of two variants' runs: of the best-ofs, of the medians,
    and the median of each repeat's ratio (which cancels slow drifts of the
    machine's load).

    Args:
        top: The numerator's runs, dicts with `key` and `"repeat"`.
        bottom: The denominator's runs, alike.
        key: The throughput in a run's dict.

    Returns:
        The three ratios.
    """
    by_repeat = {r["repeat"]: r[key] for r in bottom}
    paired = statistics.median(
        r[key] / by_repeat[r["repeat"]] for r in top if r["repeat"] in by_repeat
    )
    best_top, median_top = summary([r[key] for r in top])
    best_bottom, median_bottom = summary([r[key] for r in bottom])
    return best_top / best_bottom, median_top / median_bottom, paired


def best_median_table(results, rows, key):
    """A markdown table of the ratios of two variants' best-of and median
    `key` (their runs in `results`, by name), without the per-repeat
    column of `ratio_table`.

    Args:
        results: Per variant name, its runs: dicts with `key`.
        rows: The table's rows, as (numerator, denominator, goal or None);
            a row whose variant is not in `results` says "not run".
        key: The throughput in a run's dict.
    """
    lines = []
    for numerator, denominator, goal in rows:
        label = f"{numerator} / {denominator}"
        goal_text = "-" if goal is None else f">= {goal}"
        if numerator not in results or denominator not in results:
            lines.append([label, "n/a", "n/a", goal_text, "not run"])
            continue
        top, bottom = (
            summary([r[key] for r in results[name]])
            for name in (numerator, denominator)
        )
        ratios = [a / b for a, b in zip(top, bottom)]
        met_text = "-" if goal is None else met(ratios, goal)
        lines.append([label, *(f"{r:.2f}" for r in ratios), goal_text])
        lines[-1].append(met_text)
    columns = ["ratio", "best-of", "median", "goal", "met (best / median)"]
    return table(columns, lines, align="lrrrl")


def ratio_table(results, rows, key, notes=None):
    """A markdown table of ratios between variants run in repeats.

    Args:
        results: Per variant name, its runs: dicts with `key` and
            `"repeat"`, the index of the repeat. An empty list is a variant
            that failed; a name not in `results`, a variant not run.
        rows: The table's rows, as (numerator, denominator, goal or None).
        key: The throughput in a run's dict, e.g. `"steps_per_s"`.
        notes: Per variant name, why it has no throughput: written instead
            of the ratios of the rows it is in.

    Returns:
        The table, ending with a newline.
    """
    notes = notes or {}
    lines = list(RATIO_HEADER)
    for numerator, denominator, goal in rows:
        label = f"{numerator} / {denominator}"
        top, bottom = results.get(numerator), results.get(denominator)
        note = notes.get(numerator) or notes.get(denominator)
        if note is None and (not top or not bottom):
            missing = numerator if not top else denominator
            note = f"{missing} {'failed' if missing in results else 'not run'}"
        if note is not None:
            lines.append(f"| {label} | n/a | n/a | n/a | - | {note} |")
            continue
        values = ratios_of(top, bottom, key)
        goal_text, met_text = "-", "-"
        if goal is not None:
            goal_text, met_text = f">= {goal:g}", met(values, goal)
        lines.append(
            f"| {label} | {values[0]:.2f} | {values[1]:.2f} "
            f"| {values[2]:.2f} | {goal_text} | {met_text} |"
        )
    return "\n".join(lines) + "\n"
