"""Best-of, median and ratios of throughputs measured in repeated runs.

Standard library only: the drivers of the multi-worker benchmarks, which
import no Keras, print these tables too.
"""

import statistics

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
