"""When AGN pays off: a step's time across workers, and the break-even.

A training step across `n` workers costs its compute plus its share of the
synchronisation rounds:

    step = compute + overhead / steps_per_execution + round / period
    round = 2 (n - 1) hop + 8 ring_bytes / bandwidth

A round is a ring all-reduce of the model: `2 (n - 1)` steps around the
ring (`hop` each, the per-collective overhead), and its bytes through the
narrowest queue. Each worker's network card carries `2 (n - 1) / n` of the
model; where all workers share one queue (one link, one switch port, a
shaped loopback) it carries `2 (n - 1)` models. Synchronous training is
period 1. `overhead` is one small collective per execution (the logs'
all-reduce), `2 (n - 1) hop` too.

AGN needs more local steps than synchronous training to reach the same
accuracy (`step_factor`, e.g. 1.5: half as many again), so it wins when

    step_factor * step(period) < step(1),

which needs a round to cost more than `(step_factor - 1) * compute`; the
break-even period and bandwidth follow (`StepCost.break_even_period`,
`StepCost.break_even_bandwidth`).

    from keras_clones.cost_model import StepCost
    cost = StepCost(compute_seconds=0.003, hop_seconds=0.004,
                    model_bytes=1_077_288, workers=8)
    cost.speed_up(period=64, bandwidth=1e9, step_factor=1.5)

or from the shell (no TensorFlow is imported):

    python -m keras_clones.cost_model --model-bytes 1077288 \\
        --compute-ms 3 --hop-ms 4 --workers 8 --bandwidth 1gbit \\
        --period 64 --steps-per-execution 40

(`--bandwidth` takes its unit, bits per second: `1000` alone is refused,
`1000bit` is not; `--params N` with `--dtype`, float32 by default, stands
for `--model-bytes`; the output says which link model it used: one link
shared by all workers unless `--own-links`, each worker's card its own).

Fit `compute_seconds` and `hop_seconds` to your own machine with
`fit_step_cost` (times per step of a few periods on a fast link), and take
`model_bytes` from `AGNOptimizer.bytes_per_round`.
"""

import argparse
import dataclasses
import math
import numbers
import operator
import re
import sys

_RATE_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_RATE = re.compile(
    r"^((?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*([kmgt]?)(bit(?:/s)?)?$"
)


def parse_bandwidth(text):
    """Bits per second from `"100mbit"`, `"1gbit"`, `"10Mbit/s"` or a number
    (`tc`'s rate units in bits; byte rates such as `"mbps"` are refused).

    Raises:
        ValueError: `text` is not a positive, finite rate in bits.
    """
    match = _RATE.match(str(text).strip().lower())
    value = float(match.group(1)) * _RATE_UNITS[match.group(2)] if match else 0
    if not 0 < value < math.inf:
        raise ValueError(
            "Expected a positive bandwidth in bits per second, such as "
            "'100mbit', '1gbit', '10Mbit/s' or 1e9 (byte rates such as "
            f"'mbps' or 'MB/s' are not accepted: multiply by 8). Received: "
            f"{text!r}."
        )
    return value


def _check_number(name, value, unit, zero=False, infinite=False):
    """`value` as a float: a real number (not a bool) above 0 (or at it,
    with `zero`), finite (unless `infinite`)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"`{name}` must be a number of {unit}. Received: {value!r} of "
            f"type {type(value).__name__}."
        )
    value = float(value)
    if math.isnan(value) or value < 0 or (value == 0 and not zero):
        bound = ">= 0" if zero else "> 0"
        raise ValueError(
            f"`{name}` must be {bound}, in {unit}. Received: {value!r}."
        )
    if math.isinf(value) and not infinite:
        raise ValueError(
            f"`{name}` must be finite, in {unit}. Received: {value!r}."
        )
    return value


def _check_count(name, value, minimum, why=""):
    """`value` as an int (a Python or NumPy integer, not a bool) of at
    least `minimum`."""
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise TypeError(
            f"`{name}` must be an integer. Received: {value!r} of type "
            f"{type(value).__name__}."
        ) from None
    if value < minimum:
        raise ValueError(
            f"`{name}` must be >= {minimum}{why}. Received: {value!r}."
        )
    return value


def _check_workers(workers):
    return _check_count(
        "workers", workers, 2, " (one worker never synchronises)"
    )


def _check_shared_link(shared_link):
    if not isinstance(shared_link, bool):
        raise TypeError(
            "`shared_link` must be True (all workers' traffic through one "
            "queue) or False (a network card per worker). Received: "
            f"{shared_link!r}."
        )


def _check_step_factor(step_factor):
    step_factor = _check_number("step_factor", step_factor, "steps per step")
    if step_factor < 1:
        raise ValueError(
            "`step_factor` is AGN's local steps to a target over synchronous "
            f"training's, at least 1. Received: {step_factor!r}."
        )
    return step_factor


def _check_steps_per_execution(steps_per_execution):
    if steps_per_execution is None:
        return None
    return _check_count("steps_per_execution", steps_per_execution, 1)


def ring_bytes(model_bytes, workers, shared_link=True):
    """The bytes one ring all-reduce of `model_bytes` puts through the
    narrowest queue: `2 (n - 1) / n` of the model through each worker's
    card, or `2 (n - 1)` models through one queue that all workers share."""
    model_bytes = _check_number("model_bytes", model_bytes, "bytes")
    workers = _check_workers(workers)
    _check_shared_link(shared_link)
    per_worker = 2 * (workers - 1) / workers * model_bytes
    return per_worker * workers if shared_link else per_worker


@dataclasses.dataclass(frozen=True)
class StepCost:
    """What one training step costs on `workers` workers.

    Args:
        compute_seconds: One local step's compute on one worker (forward,
            backward and the optimizer's local update), e.g. 0.003.
        hop_seconds: The per-collective overhead of one of the ring's
            `2 (n - 1)` steps, bandwidth aside (0: bandwidth alone).
        model_bytes: The bytes each worker contributes to a round
            (`AGNOptimizer.bytes_per_round`).
        workers: The number of workers, at least 2.
        shared_link: True if all workers' traffic passes one queue (one
            link, a shaped loopback); False if each worker has a network
            card of its own at the given bandwidth.
    """

    compute_seconds: float
    hop_seconds: float
    model_bytes: float
    workers: int
    shared_link: bool = True

    def __post_init__(self):
        _check_number("compute_seconds", self.compute_seconds, "seconds")
        _check_number("hop_seconds", self.hop_seconds, "seconds", zero=True)
        ring_bytes(self.model_bytes, self.workers, self.shared_link)

    @property
    def collective_overhead(self):
        """One collective's overhead: `2 (n - 1)` ring steps."""
        return 2 * (self.workers - 1) * self.hop_seconds

    def round_seconds(self, bandwidth, burst_bytes=0.0, idle_seconds=math.inf):
        """One all-reduce of the model at `bandwidth` bits per second (None:
        no limit, the overhead alone).

        On a token-bucket link (`tc`'s `tbf`, a cloud machine's burst
        allowance), the first `burst_bytes` pass at once if the bucket has
        refilled, at the link's rate, during the `idle_seconds` since the
        previous round; the rest at `bandwidth`.
        """
        burst_bytes = _check_number("burst_bytes", burst_bytes, "bytes", True)
        idle_seconds = _check_number(
            "idle_seconds", idle_seconds, "seconds", zero=True, infinite=True
        )
        if bandwidth is None:
            return self.collective_overhead
        bandwidth = _check_number("bandwidth", bandwidth, "bits per second")
        queued = ring_bytes(self.model_bytes, self.workers, self.shared_link)
        credit = min(burst_bytes, bandwidth * idle_seconds / 8)
        transfer = 8 * max(0.0, queued - credit) / bandwidth
        return self.collective_overhead + transfer

    def _logs_overhead(self, steps_per_execution):
        """The logs' collective, per step."""
        steps_per_execution = _check_steps_per_execution(steps_per_execution)
        if steps_per_execution is None:
            return 0.0
        return self.collective_overhead / steps_per_execution

    def step_seconds(
        self, period, bandwidth, steps_per_execution=None, burst_bytes=0.0
    ):
        """One step at `period` (1: synchronous) and `bandwidth`, with one
        small collective per execution of `steps_per_execution` steps
        (None: none), on a link with a token bucket of `burst_bytes` (0: a
        plain link) that refills while a period's steps compute."""
        period = _check_count("period", period, 1)
        idle = period * self.compute_seconds
        round_ = self.round_seconds(bandwidth, burst_bytes, idle)
        logs = self._logs_overhead(steps_per_execution)
        return self.compute_seconds + logs + round_ / period

    def speed_up(
        self, period, bandwidth, step_factor=1.0, steps_per_execution=None
    ):
        """Synchronous training's time to a target over AGN's at `period`,
        which needs `step_factor` times the steps."""
        step_factor = _check_step_factor(step_factor)
        synchronous = self.step_seconds(1, bandwidth, steps_per_execution)
        agn = self.step_seconds(period, bandwidth, steps_per_execution)
        return synchronous / (step_factor * agn)

    def break_even_period(
        self, bandwidth, step_factor, steps_per_execution=None
    ):
        """The shortest period at which AGN reaches a target sooner than
        synchronous training at `bandwidth` (at least 2: period 1 is
        synchronous training); None if no period does (a round costs no
        more than `(step_factor - 1)` steps' compute)."""
        step_factor = _check_step_factor(step_factor)
        round_ = self.round_seconds(bandwidth)
        compute = self.compute_seconds + self._logs_overhead(
            steps_per_execution
        )
        margin = round_ - (step_factor - 1) * compute
        if margin <= 0:
            return None
        # Strictly sooner: the first integer above step_factor * round_ /
        # margin (a tie is no gain).
        return max(2, math.floor(step_factor * round_ / margin + 1e-9) + 1)

    def break_even_bandwidth(
        self, period, step_factor, steps_per_execution=None
    ):
        """The bandwidth (bits per second) below which AGN at `period`
        reaches a target sooner than synchronous training: `math.inf` if it
        does at any bandwidth (the overhead alone is enough), 0.0 if at
        none (`period <= step_factor`)."""
        period = _check_count("period", period, 1)
        step_factor = _check_step_factor(step_factor)
        if period <= step_factor:
            return 0.0
        compute = self.compute_seconds + self._logs_overhead(
            steps_per_execution
        )
        needed = (step_factor - 1) * compute * period / (period - step_factor)
        transfer = needed - self.collective_overhead
        if transfer <= 0:
            return math.inf
        bits = 8 * ring_bytes(self.model_bytes, self.workers, self.shared_link)
        return bits / transfer


def fit_step_cost(
    measurements, model_bytes, workers, shared_link=True, bandwidth=None
):
    """Fits compute and per-hop overhead to measured times per step.

    Least squares of `seconds - transfer / period = compute + collectives *
    overhead`, with `collectives = 1 / period + 1 / steps_per_execution` per
    step and `transfer` the round's bytes at `bandwidth`. Measure on a fast
    link (an unshaped loopback, `bandwidth=None`: its transfer is taken as
    part of the overhead).

    Args:
        measurements: `(period, steps_per_execution, seconds_per_step)`
            triples, from at least two different periods.
        model_bytes, workers, shared_link: As for `StepCost`.
        bandwidth: The link's bits per second, or None (no limit).

    Returns:
        The fitted `StepCost`.

    Raises:
        TypeError, ValueError: A measurement that is not such a triple,
            fewer than two periods, or a fit that gives no positive compute
            time or a negative overhead.
    """
    measurements = list(measurements)
    unit = StepCost(1.0, 0.0, model_bytes, workers, shared_link)
    transfer = unit.round_seconds(bandwidth)
    points = [
        _fit_point(index, measurement, transfer)
        for index, measurement in enumerate(measurements)
    ]
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        raise ValueError(
            "fit_step_cost needs times per step of at least two different "
            f"periods. Received: {measurements!r}."
        )
    mean_x = sum(xs) / len(xs)
    mean_y = sum(y for _, y in points) / len(points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    compute = mean_y - slope * mean_x
    if compute <= 0 or slope < 0:
        raise ValueError(
            f"The fit gives {compute:.3g} s of compute per step and "
            f"{slope:.3g} s per collective: the measurements do not follow "
            "the model (both must be positive, and a longer period not "
            f"slower). Received: {measurements!r}."
        )
    hop = slope / (2 * (unit.workers - 1))
    return StepCost(compute, hop, model_bytes, workers, shared_link)


def _fit_point(index, measurement, transfer):
    """`(collectives per step, seconds less the transfer)` of one
    measurement."""
    name = f"measurements[{index}]"
    try:
        period, execution, seconds = measurement
    except (TypeError, ValueError):
        raise TypeError(
            f"`{name}` must be a (period, steps_per_execution, "
            f"seconds_per_step) triple. Received: {measurement!r}."
        ) from None
    period = _check_count(f"{name}'s period", period, 1)
    execution = _check_count(f"{name}'s steps_per_execution", execution, 1)
    seconds = _check_number(f"{name}'s seconds_per_step", seconds, "seconds")
    return 1 / period + 1 / execution, seconds - transfer / period


def format_bandwidth(bits):
    """`"100 Mbit/s"` for 1e8; `"any bandwidth"` for `math.inf`."""
    if bits == math.inf:
        return "any bandwidth"
    if bits == 0:
        return "no bandwidth"
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= 0.9995 * scale:  # Not "1e+03 Mbit/s".
            return f"{bits / scale:.3g} {unit}"
    return f"{bits:.3g} bit/s"


# The bytes of one parameter in each dtype a round can send it in
# (`AGNOptimizer`'s `communication_dtype`), for `--params`.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}

_PROG = "python -m keras_clones.cost_model"
_BIT_UNITS = "bit, kbit, mbit, gbit or tbit; '/s' optional"
# A rate as typed, its sign kept (so that "-1gbit" is told it is negative)
# and its unit optional (so that "1000" is told it needs one).
_TYPED_RATE = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*([kmgt]?)"
    r"(bit(?:/s)?|bps|b/s|bytes?(?:/s)?)?$"
)
# A value that starts with a minus and a digit ("-200", "-1gbit", "-2e3"):
# no option of the command does.
_NEGATIVE_VALUE = re.compile(r"^-\.?\d")

_DESCRIPTION = """\
Predicts synchronous and AGN training's time per step across workers, and
where AGN breaks even. Imports no TensorFlow.
"""

_EPILOG = f"""\
examples:
  {_PROG} --model-bytes 1077288 \\
      --compute-ms 3 --workers 8 --bandwidth 1gbit --own-links
  {_PROG} --params 269322 --dtype bfloat16 \\
      --compute-ms 3 --workers 8 --bandwidth 100mbit

Without --own-links, all workers' traffic shares one queue at --bandwidth
(one link, one switch port, a shaped loopback): a ring all-reduce puts
2 (n - 1) models through it, n times what each worker's own card carries.
The output's "link model" line says which was used.
"""


class _OptionError(ValueError):
    """A command-line value that cannot be used; its message names the
    option, the value as typed, and what to pass."""


def _join_negative_values(argv):
    """`--flag -200` as `--flag=-200`, so that a negative value reaches the
    option's own check: argparse takes a value such as `-1gbit` or `-2e3`
    for an option name ("expected one argument")."""
    joined = []
    for arg in argv:
        previous = joined[-1] if joined else ""
        if (
            _NEGATIVE_VALUE.match(arg)
            and previous.startswith("--")
            and previous != "--"
            and "=" not in previous
        ):
            joined[-1] = f"{previous}={arg}"
        else:
            joined.append(arg)
    return joined


def _float_or_none(text):
    try:
        return float(text)
    except ValueError:
        return None


def _option_number(flag, text, what, example, minimum=0.0, inclusive=False):
    """`text` of option `flag` as a finite float above `minimum` (or at it,
    with `inclusive`)."""
    value = _float_or_none(text)
    problem = None
    if value is None or math.isnan(value):
        problem = "must be a number"
    elif math.isinf(value):
        problem = "must be finite"
    elif value < minimum or (value == minimum and not inclusive):
        problem = f"must be {'at least' if inclusive else 'above'} {minimum:g}"
    if problem:
        raise _OptionError(
            f"{flag} {problem} ({what}). Received: {text}. Pass e.g. "
            f"{flag} {example}."
        )
    return value


def _option_count(flag, text, what, example, minimum):
    """`text` of option `flag` as a whole number of at least `minimum`
    ("8", or "1e6" for a million)."""
    value = _float_or_none(text)
    if value is None or not math.isfinite(value) or not value.is_integer():
        raise _OptionError(
            f"{flag} must be a whole number ({what}). Received: {text}. "
            f"Pass e.g. {flag} {example}."
        )
    count = int(text) if re.fullmatch(r"[+-]?\d+", text.strip()) else int(value)
    if count < minimum:
        raise _OptionError(
            f"{flag} must be at least {minimum} ({what}). Received: {text}. "
            f"Pass e.g. {flag} {example}."
        )
    return count


def _option_bandwidth(flag, text):
    """`text` of option `flag` as bits per second, from a rate with its
    unit in bits (`100mbit`, `1gbit`, `1000bit`, `10Mbit/s`)."""
    match = _TYPED_RATE.match(text.strip().lower())
    if not match:
        raise _OptionError(
            f"{flag} must be the link's rate in bits per second, with its "
            f"unit ({_BIT_UNITS}). "
            f"Received: {text}. Pass e.g. {flag} 100mbit or {flag} 1gbit."
        )
    number, prefix, unit = match.groups()
    value = float(number) * _RATE_UNITS[prefix]
    if math.isinf(value) or value <= 0:
        raise _OptionError(
            f"{flag} must be {'finite' if value > 0 else 'above 0'}, in bits "
            f"per second. Received: {text}. Pass the link's rate with its "
            f"unit, e.g. {flag} 1gbit."
        )
    if unit is None:
        suggestion = f"{flag} {number}{prefix}bit for {format_bandwidth(value)}"
        if not prefix:
            suggestion += (
                f", or {flag} {number}mbit for {format_bandwidth(value * 1e6)}"
            )
        raise _OptionError(
            f"{flag} needs a unit ({_BIT_UNITS}): a bare number would be "
            f"read as bits per second. Received: {text}. Pass e.g. "
            f"{suggestion}."
        )
    if not unit.startswith("bit"):
        raise _OptionError(
            f"{flag} takes bits per second ({_BIT_UNITS}), not byte rates or "
            "'bps' (bits to some, bytes to tc). Received: "
            f"{text}. Pass e.g. {flag} {number}{prefix}bit for "
            f"{format_bandwidth(value)}, or {flag} "
            f"{float(number) * 8:g}{prefix}bit if you mean {number} "
            f"{prefix.upper()}B a second."
        )
    return value


def _format_count(value):
    """`"1,077,288"` for 1077288."""
    return f"{value:,.10g}"


def _model_bytes(args):
    """The bytes per round from `--model-bytes`, or `--params` and
    `--dtype`; and the output's line that says how they were read."""
    if args.model_bytes is not None and args.params is not None:
        raise _OptionError(
            "--model-bytes and --params both give the model's size: pass "
            f"one. Received: --model-bytes {args.model_bytes} and --params "
            f"{args.params}. Drop one of them."
        )
    if args.params is None:
        if args.model_bytes is None:
            raise _OptionError(
                "The model's size is missing. Received: neither --model-bytes "
                "nor --params. Pass --model-bytes BYTES (bytes per round, "
                "AGNOptimizer.bytes_per_round) or --params N (its parameters, "
                "with --dtype, float32 by default)."
            )
        if args.dtype is not None:
            raise _OptionError(
                "--dtype sizes the parameters of --params; --model-bytes is "
                f"bytes already. Received: --model-bytes {args.model_bytes} "
                f"and --dtype {args.dtype}. Drop --dtype, or pass --params "
                "instead of --model-bytes."
            )
        model_bytes = _option_number(
            "--model-bytes",
            args.model_bytes,
            "bytes per round, AGNOptimizer.bytes_per_round",
            "1077288",
        )
        return model_bytes, f"model: {_format_count(model_bytes)} bytes a round"
    params = _option_count(
        "--params", args.params, "the model's parameters", "269322", 1
    )
    dtype = "float32" if args.dtype is None else args.dtype
    if dtype.lower() not in DTYPE_BYTES:
        raise _OptionError(
            f"--dtype must be one of {', '.join(DTYPE_BYTES)} (what a round "
            f"sends each parameter as). Received: {dtype}. Pass e.g. --dtype "
            "bfloat16, or leave it out for float32."
        )
    size = DTYPE_BYTES[dtype.lower()]
    model_bytes = float(params * size)
    return model_bytes, (
        f"model: {_format_count(params)} parameters x {size} bytes "
        f"({dtype.lower()}) = {_format_count(model_bytes)} bytes a round"
    )


def _link_line(bandwidth, workers, shared_link):
    rate = format_bandwidth(bandwidth)
    if shared_link:
        return (
            f"link model: shared link, one {rate} queue for all {workers} "
            f"workers, {2 * (workers - 1)} models a round through it "
            f"(--own-links: a {rate} card per worker)"
        )
    return (
        f"link model: own links, a {rate} card per worker, "
        f"{2 * (workers - 1) / workers:.3g} of a model a round through each "
        "(without --own-links: one queue shared by all)"
    )


def _parser():
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model-bytes",
        metavar="BYTES",
        help="bytes per round (AGNOptimizer.bytes_per_round); or --params",
    )
    parser.add_argument(
        "--params",
        metavar="N",
        help="the model's parameters, instead of --model-bytes: a round "
        "is N x the size of --dtype bytes",
    )
    parser.add_argument(
        "--dtype",
        help=f"with --params: what a round sends each parameter as, one of "
        f"{', '.join(DTYPE_BYTES)} (AGNOptimizer's communication_dtype; "
        "default float32)",
    )
    parser.add_argument(
        "--compute-ms",
        metavar="MS",
        required=True,
        help="one local step's compute on one worker, in milliseconds",
    )
    parser.add_argument(
        "--workers",
        metavar="N",
        required=True,
        help="the number of workers, at least 2",
    )
    parser.add_argument(
        "--bandwidth",
        metavar="RATE",
        required=True,
        help="the link's rate in bits per second, with its unit: 100mbit, "
        "1gbit, 1000bit (bit, kbit, mbit, gbit, tbit; '/s' optional; a bare "
        "number is refused); one link shared by all workers unless "
        "--own-links",
    )
    parser.add_argument(
        "--own-links",
        action="store_true",
        help="each worker has a card of its own at --bandwidth (default: "
        "one link shared by all, which carries n times the bytes)",
    )
    parser.add_argument(
        "--period",
        metavar="P",
        default="64",
        help="AGN's communication_period (default 64)",
    )
    parser.add_argument(
        "--step-factor",
        metavar="S",
        default="1.5",
        help="AGN's local steps to a target over synchronous "
        "training's (default 1.5, measured in bench/wan.py)",
    )
    parser.add_argument(
        "--hop-ms",
        metavar="MS",
        default="0",
        help="per-collective overhead of one ring step, in milliseconds "
        "(default 0: bandwidth alone; bench/wan.py fitted 7 on 2 processes "
        "sharing 2 cores; fit yours with fit_step_cost)",
    )
    parser.add_argument(
        "--steps-per-execution",
        metavar="K",
        default="1",
        help="the model's steps_per_execution: one small collective (the "
        "logs) per execution (default 1, Keras's)",
    )
    return parser


def main(argv=None):
    parser = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(_join_negative_values(argv))
    try:
        model_bytes, model_line = _model_bytes(args)
        compute = _option_number(
            "--compute-ms",
            args.compute_ms,
            "one local step's compute on one worker, in milliseconds",
            "3",
        )
        workers = _option_count(
            "--workers",
            args.workers,
            "the number of workers; one worker never synchronises",
            "8",
            2,
        )
        bandwidth = _option_bandwidth("--bandwidth", args.bandwidth)
        period = _option_count(
            "--period",
            args.period,
            "AGN's communication_period; 1 is synchronous training",
            "64",
            1,
        )
        step_factor = _option_number(
            "--step-factor",
            args.step_factor,
            "AGN's local steps to a target over synchronous training's",
            "1.5",
            minimum=1.0,
            inclusive=True,
        )
        hop = _option_number(
            "--hop-ms",
            args.hop_ms,
            "per-collective overhead of one ring step, in milliseconds",
            "4",
            inclusive=True,
        )
        execution = _option_count(
            "--steps-per-execution",
            args.steps_per_execution,
            "the model's steps_per_execution",
            "40",
            1,
        )
        cost = StepCost(
            compute / 1e3,
            hop / 1e3,
            model_bytes,
            workers,
            shared_link=not args.own_links,
        )
        synchronous = cost.step_seconds(1, bandwidth, execution)
        agn = cost.step_seconds(period, bandwidth, execution)
        speed_up = cost.speed_up(period, bandwidth, step_factor, execution)
        break_even = cost.break_even_period(bandwidth, step_factor, execution)
        below = cost.break_even_bandwidth(period, step_factor, execution)
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    round_ = cost.round_seconds(bandwidth)
    print(model_line)
    print(_link_line(bandwidth, workers, cost.shared_link))
    print(f"round (one all-reduce): {1e3 * round_:.1f} ms")
    print(f"synchronous: {1e3 * synchronous:.2f} ms per step")
    print(f"AGN period {period}: {1e3 * agn:.2f} ms per step")
    print(
        f"time to target, synchronous / AGN (x{step_factor:g} the "
        f"steps): {speed_up:.2f}"
    )
    print(
        "break-even period at this bandwidth: "
        + ("none" if break_even is None else str(break_even))
    )
    print(f"AGN period {period} is faster below: {format_bandwidth(below)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
