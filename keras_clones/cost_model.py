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
        --compute-ms 3 --workers 8 --bandwidth 1gbit --period 64

Fit `compute_seconds` and `hop_seconds` to your own machine with
`fit_step_cost` (times per step of a few periods on a fast link), and take
`model_bytes` from `AGNOptimizer.bytes_per_round`.
"""

import argparse
import dataclasses
import math
import re
import sys

_RATE_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_RATE = re.compile(
    r"^([0-9.]+(?:e[0-9+-]+)?)\s*([kmgt]?)(?:bit(?:/s)?|bps|b/s)?$"
)


def parse_bandwidth(text):
    """Bits per second from `"100mbit"`, `"1gbit"`, `"10Mbit/s"` or a number.

    Raises:
        ValueError: `text` is not a positive rate.
    """
    match = _RATE.match(str(text).strip().lower())
    value = float(match.group(1)) * _RATE_UNITS[match.group(2)] if match else 0
    if value <= 0:
        raise ValueError(
            f"Expected a positive bandwidth such as '100mbit', '1gbit' or "
            f"1e9 (bits per second). Received: {text!r}."
        )
    return value


def ring_bytes(model_bytes, workers, shared_link=True):
    """The bytes one ring all-reduce of `model_bytes` puts through the
    narrowest queue: `2 (n - 1) / n` of the model through each worker's
    card, or `2 (n - 1)` models through one queue that all workers share."""
    per_worker = 2 * (workers - 1) / workers * model_bytes
    return per_worker * workers if shared_link else per_worker


def _positive(name, value, allow_zero=False):
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"`{name}` must be a number. Received: {value!r}.")
    if value < 0 or (value == 0 and not allow_zero) or math.isnan(value):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"`{name}` must be {bound}. Received: {value!r}.")


@dataclasses.dataclass(frozen=True)
class StepCost:
    """What one training step costs on `workers` workers.

    Args:
        compute_seconds: One local step's compute on one worker (forward,
            backward and the optimizer's local update).
        hop_seconds: The per-collective overhead of one of the ring's
            `2 (n - 1)` steps, bandwidth aside.
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
        _positive("compute_seconds", self.compute_seconds)
        _positive("hop_seconds", self.hop_seconds, allow_zero=True)
        _positive("model_bytes", self.model_bytes)
        if not isinstance(self.workers, int) or self.workers < 2:
            raise ValueError(
                "`workers` must be an integer >= 2 (one worker never "
                f"synchronises). Received: {self.workers!r}."
            )

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
        transfer = 0.0
        if bandwidth is not None:
            _positive("bandwidth", bandwidth)
            _positive("burst_bytes", burst_bytes, allow_zero=True)
            queued = ring_bytes(
                self.model_bytes, self.workers, self.shared_link
            )
            credit = min(burst_bytes, bandwidth * idle_seconds / 8)
            transfer = 8 * max(0.0, queued - credit) / bandwidth
        return self.collective_overhead + transfer

    def step_seconds(
        self, period, bandwidth, steps_per_execution=None, burst_bytes=0.0
    ):
        """One step at `period` (1: synchronous) and `bandwidth`, with one
        small collective per execution of `steps_per_execution` steps
        (None: none), on a link with a token bucket of `burst_bytes` (0: a
        plain link) that refills while a period's steps compute."""
        _check_period("period", period)
        idle = period * self.compute_seconds
        round_ = self.round_seconds(bandwidth, burst_bytes, idle)
        seconds = self.compute_seconds + round_ / period
        if steps_per_execution is not None:
            seconds += self.collective_overhead / steps_per_execution
        return seconds

    def speed_up(self, period, bandwidth, step_factor=1.0):
        """Synchronous training's time to a target over AGN's at `period`,
        which needs `step_factor` times the steps."""
        _check_step_factor(step_factor)
        synchronous = self.step_seconds(1, bandwidth)
        return synchronous / (
            step_factor * self.step_seconds(period, bandwidth)
        )

    def break_even_period(self, bandwidth, step_factor):
        """The shortest period at which AGN reaches a target sooner than
        synchronous training at `bandwidth`; None if no period does (a
        round costs less than `(step_factor - 1) * compute`)."""
        _check_step_factor(step_factor)
        round_ = self.round_seconds(bandwidth)
        margin = round_ - (step_factor - 1) * self.compute_seconds
        if margin <= 0:
            return None
        return max(1, math.ceil(step_factor * round_ / margin - 1e-9))

    def break_even_bandwidth(self, period, step_factor):
        """The bandwidth (bits per second) below which AGN at `period`
        reaches a target sooner than synchronous training: `math.inf` if it
        does at any bandwidth (the overhead alone is enough), 0.0 if at
        none (`period <= step_factor`)."""
        _check_period("period", period)
        _check_step_factor(step_factor)
        if period <= step_factor:
            return 0.0
        extra = step_factor - 1
        needed = extra * self.compute_seconds * period / (period - step_factor)
        transfer = needed - self.collective_overhead
        if transfer <= 0:
            return math.inf
        bits = 8 * ring_bytes(self.model_bytes, self.workers, self.shared_link)
        return bits / transfer


def _check_period(name, period):
    if not isinstance(period, int) or isinstance(period, bool) or period < 1:
        raise ValueError(
            f"`{name}` must be an integer >= 1. Received: {period!r}."
        )


def _check_step_factor(step_factor):
    _positive("step_factor", step_factor)
    if step_factor < 1:
        raise ValueError(
            "`step_factor` is AGN's local steps to a target over synchronous "
            f"training's, at least 1. Received: {step_factor!r}."
        )


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
        ValueError: Fewer than two periods, or a fit that gives no positive
            compute time or a negative overhead.
    """
    measurements = list(measurements)
    unit = StepCost(1.0, 0.0, model_bytes, workers, shared_link)
    transfer = unit.round_seconds(bandwidth)
    points = [
        (1 / period + 1 / execution, seconds - transfer / period)
        for period, execution, seconds in measurements
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
    hop = slope / (2 * (workers - 1))
    return StepCost(compute, hop, model_bytes, workers, shared_link)


def format_bandwidth(bits):
    """`"100 Mbit/s"` for 1e8; `"any bandwidth"` for `math.inf`."""
    if bits == math.inf:
        return "any bandwidth"
    if bits == 0:
        return "no bandwidth"
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.3g} {unit}"
    return f"{bits:.3g} bit/s"


def _bandwidth_argument(text):
    try:
        return parse_bandwidth(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m keras_clones.cost_model",
        description="Predicts synchronous and AGN training's time per step "
        "across workers, and where AGN breaks even.",
    )
    parser.add_argument(
        "--model-bytes",
        type=float,
        required=True,
        help="bytes per round (AGNOptimizer.bytes_per_round)",
    )
    parser.add_argument(
        "--compute-ms",
        type=float,
        required=True,
        help="one local step's compute on one worker, ms",
    )
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument(
        "--bandwidth",
        type=_bandwidth_argument,
        required=True,
        help="the link, e.g. 100mbit, 1gbit, 10gbit",
    )
    parser.add_argument(
        "--period",
        type=int,
        default=64,
        help="AGN's communication_period (default 64)",
    )
    parser.add_argument(
        "--step-factor",
        type=float,
        default=1.5,
        help="AGN's local steps to a target over synchronous "
        "training's (default 1.5, measured in bench/wan.py)",
    )
    parser.add_argument(
        "--hop-ms",
        type=float,
        default=4.0,
        help="per-collective overhead of one ring step, ms "
        "(default 4, fitted in bench/wan.py)",
    )
    parser.add_argument(
        "--own-links",
        action="store_true",
        help="each worker has a card of its own at the "
        "bandwidth (default: one link shared by all)",
    )
    args = parser.parse_args(argv)
    try:
        cost = StepCost(
            args.compute_ms / 1e3,
            args.hop_ms / 1e3,
            args.model_bytes,
            args.workers,
            shared_link=not args.own_links,
        )
        synchronous = cost.step_seconds(1, args.bandwidth)
        agn = cost.step_seconds(args.period, args.bandwidth)
        speed_up = cost.speed_up(args.period, args.bandwidth, args.step_factor)
        period = cost.break_even_period(args.bandwidth, args.step_factor)
        bandwidth = cost.break_even_bandwidth(args.period, args.step_factor)
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    round_ = cost.round_seconds(args.bandwidth)
    print(f"round (one all-reduce): {1e3 * round_:.1f} ms")
    print(f"synchronous: {1e3 * synchronous:.2f} ms per step")
    print(f"AGN period {args.period}: {1e3 * agn:.2f} ms per step")
    print(
        f"time to target, synchronous / AGN (x{args.step_factor:g} the "
        f"steps): {speed_up:.2f}"
    )
    print(
        "break-even period at this bandwidth: "
        + ("none" if period is None else str(period))
    )
    print(
        f"AGN period {args.period} is faster below: "
        f"{format_bandwidth(bandwidth)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
