"""The command line of `python -m keras_clones.cost_model`.

Each option is checked as typed, and an error names the flag, echoes the
value as given and says what to pass; `--bandwidth` takes its unit.
"""

import argparse
import math
import re
import sys

from keras_clones import commit_bytes
from keras_clones.cost_model import _RATE_UNITS
from keras_clones.cost_model import FORMS
from keras_clones.cost_model import StepCost
from keras_clones.cost_model import format_bandwidth

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
DTYPES = (*DTYPE_BYTES, *commit_bytes.BITS)

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
  {_PROG} --params 269322 --dtype int8 --form all-gather \\
      --compute-ms 3 --workers 2 --bandwidth 100mbit

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
    `--dtype`; what synchronous training all-reduces a step (with
    `--params`, its float32 gradients; with `--model-bytes`,
    `--synchronous-bytes`, else None: the round's bytes); and the output's
    line that says how they were read."""
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
        line = f"model: {_format_count(model_bytes)} bytes a round"
        synchronous = None
        if args.synchronous_bytes is not None:
            synchronous = _option_number(
                "--synchronous-bytes",
                args.synchronous_bytes,
                "bytes synchronous training all-reduces a step: its float32 "
                "gradients, 4 x its parameters",
                "1077288",
            )
        return model_bytes, synchronous, line
    if args.synchronous_bytes is not None:
        raise _OptionError(
            "--synchronous-bytes goes with --model-bytes: with --params, "
            "synchronous training all-reduces its float32 gradients, 4 x "
            f"the parameters. Received: --params {args.params} and "
            f"--synchronous-bytes {args.synchronous_bytes}. Drop "
            "--synchronous-bytes, or pass --model-bytes instead of --params."
        )
    params = _option_count(
        "--params", args.params, "the model's parameters", "269322", 1
    )
    gradients = float(params * DTYPE_BYTES["float32"])
    dtype = "float32" if args.dtype is None else args.dtype.lower()
    if dtype not in DTYPES:
        raise _OptionError(
            f"--dtype must be one of {', '.join(DTYPES)} (what a round "
            f"sends each parameter as). Received: {args.dtype}. Pass e.g. "
            "--dtype bfloat16, or leave it out for float32."
        )
    if dtype in commit_bytes.BITS:
        values = commit_bytes.value_bytes(params, dtype)
        scales = commit_bytes.scale_bytes(params)
        model_bytes = float(values + scales)
        line = (
            f"model: {_format_count(params)} parameters in {dtype} = "
            f"{_format_count(values)} bytes + {_format_count(scales)} bytes "
            f"of scales = {_format_count(model_bytes)} bytes a round"
        )
        return model_bytes, gradients, line
    size = DTYPE_BYTES[dtype]
    model_bytes = float(params * size)
    line = (
        f"model: {_format_count(params)} parameters x {size} bytes "
        f"({dtype}) = {_format_count(model_bytes)} bytes a round"
    )
    return model_bytes, gradients, line


def _form(args):
    """How a round travels: `--form`, checked against `--dtype` (8- and
    4-bit commits are all-gathered or reduce-scattered, floats
    all-reduced); by default all-reduce, or reduce-scatter in int8/int4."""
    quantized = (args.dtype or "").lower() in commit_bytes.BITS
    if args.form is None:
        return "reduce-scatter" if quantized else "all-reduce"
    if args.form not in FORMS:
        raise _OptionError(
            f"--form must be one of {', '.join(FORMS)} (how a round "
            f"travels). Received: {args.form}. Pass e.g. --form all-gather."
        )
    if quantized and args.form == "all-reduce":
        raise _OptionError(
            f"--dtype {args.dtype} commits are not all-reduced: TensorFlow "
            "all-gathers them, JAX reduce-scatters them. Received: --form "
            "all-reduce. Pass --form all-gather or --form reduce-scatter."
        )
    # With --params floats travel: float32 where --dtype is left out.
    floats = args.dtype or ("float32" if args.params is not None else None)
    if floats and not quantized and args.form != "all-reduce":
        default = "" if args.dtype else " (the default with --params)"
        raise _OptionError(
            f"--dtype {floats}{default} commits are all-reduced. Received: "
            f"--form {args.form}. Leave --form out, or pass --dtype int8 or "
            "int4."
        )
    return args.form


def _link_line(bandwidth, workers, shared_link, form):
    rate = format_bandwidth(bandwidth)
    each = 2 * (workers - 1) / workers
    if form == "all-gather":
        each = workers - 1
    how = "" if form == "all-reduce" else f"{form}; "
    if shared_link:
        return (
            f"link model: shared link, one {rate} queue for all {workers} "
            f"workers, {each * workers:.3g} models a round through it "
            f"({how}--own-links: a {rate} card per worker)"
        )
    return (
        f"link model: own links, a {rate} card per worker, "
        f"{each:.3g} of a model a round through each "
        f"({how}without --own-links: one queue shared by all)"
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
        "--synchronous-bytes",
        metavar="BYTES",
        help="with --model-bytes: what synchronous training all-reduces a "
        "step, its float32 gradients (4 x its parameters); default: "
        "--model-bytes",
    )
    parser.add_argument(
        "--dtype",
        help=f"with --params: what a round sends each parameter as, one of "
        f"{', '.join(DTYPES)} (AGNOptimizer's communication_dtype; "
        "default float32; int8 and int4 with a float32 scale per 128)",
    )
    parser.add_argument(
        "--form",
        help=f"how a round travels, one of {', '.join(FORMS)}: floats are "
        "all-reduced; int8 and int4 all-gathered (TensorFlow) or "
        "reduce-scattered (JAX, the default for them)",
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
        model_bytes, synchronous_bytes, model_line = _model_bytes(args)
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
            "AGN's communication_period; 1 commits every step",
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
            form=_form(args),
            synchronous_bytes=synchronous_bytes,
        )
        synchronous = cost.synchronous.step_seconds(1, bandwidth, execution)
        agn = cost.step_seconds(period, bandwidth, execution)
        speed_up = cost.speed_up(period, bandwidth, step_factor, execution)
        break_even = cost.break_even_period(bandwidth, step_factor, execution)
        below = cost.break_even_bandwidth(period, step_factor, execution)
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    round_ = cost.round_seconds(bandwidth)
    print(model_line)
    print(_link_line(bandwidth, workers, cost.shared_link, cost.form))
    print(f"round (one {cost.form}): {1e3 * round_:.1f} ms")
    sent = ""
    if synchronous_bytes is not None and (
        synchronous_bytes != model_bytes or cost.form != "all-reduce"
    ):
        what = "float32 gradients" if args.params else "--synchronous-bytes"
        sent = (
            f" ({what} all-reduced: "
            f"{_format_count(cost.synchronous_bytes)} bytes a step)"
        )
    print(f"synchronous: {1e3 * synchronous:.2f} ms per step{sent}")
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
