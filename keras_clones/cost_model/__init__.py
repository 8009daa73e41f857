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
period 1, its round an all-reduce of its gradients (`synchronous_bytes`:
float32's, where AGN's commits travel in bfloat16, int8 or int4).
`overhead` is one small collective per execution (the logs' all-reduce),
`2 (n - 1) hop` too.

AGN needs more local steps than synchronous training to reach the same
accuracy (`step_factor`, e.g. 1.5: half as many again), so it wins when

    step_factor * step(period) < synchronous step,

which needs synchronous training's round to cost more than
`(step_factor - 1) * compute`; the break-even period and bandwidth follow
(`StepCost.break_even_period`, `StepCost.break_even_bandwidth`).

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


# How a round travels: a ring all-reduce (float commits); the all-gather
# of TensorFlow's 8- and 4-bit commits (each worker's payload to every
# other); the reduce-scatter form of JAX's (all-to-all, then all-gather).
FORMS = ("all-reduce", "all-gather", "reduce-scatter")


def _check_form(form):
    if form not in FORMS:
        raise ValueError(
            f"`form` must be one of {', '.join(map(repr, FORMS))}: how a "
            f"round travels. Received: {form!r}."
        )
    return form


def ring_bytes(model_bytes, workers, shared_link=True, form="all-reduce"):
    """The bytes one round of `model_bytes` (each worker's payload) puts
    through the narrowest queue, in `form`: a ring all-reduce or the
    reduce-scatter form sends `2 (n - 1) / n` of it through each worker's
    card, an all-gather `n - 1` payloads; through one queue that all
    workers share, `n` times that."""
    model_bytes = _check_number("model_bytes", model_bytes, "bytes")
    workers = _check_workers(workers)
    _check_shared_link(shared_link)
    if _check_form(form) == "all-gather":
        per_worker = (workers - 1) * model_bytes
    else:
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
        form: How a round travels (`FORMS`): `"all-reduce"` (a ring, the
            default), or for 8- and 4-bit commits `"all-gather"`
            (TensorFlow's) or `"reduce-scatter"` (JAX's).
        synchronous_bytes: The bytes each worker all-reduces in a step of
            the synchronous training AGN is compared with: its gradients
            in the variables' dtype (4 bytes a parameter in float32). None:
            `model_bytes` in `form`, as AGN at period 1 sends them. Pass it
            when commits travel in fewer bytes than the gradients
            (`communication_dtype` bfloat16, int8 or int4).
    """

    compute_seconds: float
    hop_seconds: float
    model_bytes: float
    workers: int
    shared_link: bool = True
    form: str = "all-reduce"
    synchronous_bytes: float = None

    def __post_init__(self):
        _check_number("compute_seconds", self.compute_seconds, "seconds")
        _check_number("hop_seconds", self.hop_seconds, "seconds", zero=True)
        ring_bytes(self.model_bytes, self.workers, self.shared_link, self.form)
        if self.synchronous_bytes is not None:
            _check_number("synchronous_bytes", self.synchronous_bytes, "bytes")

    @property
    def synchronous(self):
        """The `StepCost` of synchronous training's steps (its period 1):
        `synchronous_bytes` all-reduced, or this one where it is None."""
        if self.synchronous_bytes is None:
            return self
        return dataclasses.replace(
            self,
            model_bytes=self.synchronous_bytes,
            form="all-reduce",
            synchronous_bytes=None,
        )

    def _ring_steps(self, form):
        """The ring steps of one collective in `form`: `2 (n - 1)`, or
        `n - 1` for an all-gather."""
        steps = self.workers - 1
        return steps if form == "all-gather" else 2 * steps

    @property
    def collective_overhead(self):
        """One collective's overhead: `2 (n - 1)` ring steps (`n - 1` for
        an all-gather)."""
        return self._ring_steps(self.form) * self.hop_seconds

    def _round_bytes(self):
        return ring_bytes(
            self.model_bytes, self.workers, self.shared_link, self.form
        )

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
        queued = self._round_bytes()
        credit = min(burst_bytes, bandwidth * idle_seconds / 8)
        transfer = 8 * max(0.0, queued - credit) / bandwidth
        return self.collective_overhead + transfer

    def _logs_overhead(self, steps_per_execution):
        """The logs' collective (an all-reduce, `2 (n - 1)` ring steps
        whatever form a round travels in), per step."""
        steps_per_execution = _check_steps_per_execution(steps_per_execution)
        if steps_per_execution is None:
            return 0.0
        all_reduce = self._ring_steps("all-reduce") * self.hop_seconds
        return all_reduce / steps_per_execution

    def step_seconds(
        self, period, bandwidth, steps_per_execution=None, burst_bytes=0.0
    ):
        """One step of AGN at `period` and `bandwidth`, with one small
        collective per execution of `steps_per_execution` steps (None:
        none), on a link with a token bucket of `burst_bytes` (0: a plain
        link) that refills while a period's steps compute. Synchronous
        training's step is `synchronous.step_seconds(1, ...)`."""
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
        synchronous = self.synchronous.step_seconds(
            1, bandwidth, steps_per_execution
        )
        agn = self.step_seconds(period, bandwidth, steps_per_execution)
        return synchronous / (step_factor * agn)

    def break_even_period(
        self, bandwidth, step_factor, steps_per_execution=None
    ):
        """The shortest period at which AGN reaches a target sooner than
        synchronous training at `bandwidth`: at least 2 where a round sends
        what synchronous training's does (period 1 is then synchronous
        training), 1 where commits in fewer bytes win at every step; None if
        no period does (synchronous training's round costs no more than
        `(step_factor - 1)` steps' compute)."""
        step_factor = _check_step_factor(step_factor)
        round_ = self.round_seconds(bandwidth)
        compute = self.compute_seconds + self._logs_overhead(
            steps_per_execution
        )
        synchronous_round = self.synchronous.round_seconds(bandwidth)
        margin = synchronous_round - (step_factor - 1) * compute
        if margin <= 0:
            return None
        # Strictly sooner: the first integer above step_factor * round_ /
        # margin (a tie is no gain).
        return max(1, math.floor(step_factor * round_ / margin + 1e-9) + 1)

    def break_even_bandwidth(
        self, period, step_factor, steps_per_execution=None
    ):
        """The bandwidth (bits per second) below which AGN at `period`
        reaches a target sooner than synchronous training: `math.inf` if it
        does at any bandwidth (the overhead alone is enough), 0.0 if below
        none: its rounds, over `step_factor` times the steps, queue no fewer
        bytes a step than synchronous training's (with the same bytes,
        `period <= step_factor`). AGN may then still be sooner above some
        bandwidth, where it waits on fewer ring steps (an all-gather's
        `n - 1`): `speed_up` says."""
        period = _check_count("period", period, 1)
        step_factor = _check_step_factor(step_factor)
        synchronous = self.synchronous
        # AGN is sooner where step_factor x its step is shorter than
        # synchronous training's: 8 saved / bandwidth > extra, with the
        # bytes a step AGN saves on the queue and the time it adds besides.
        saved = (
            synchronous._round_bytes()
            - step_factor * self._round_bytes() / period
        )
        if saved <= 0:
            return 0.0
        compute = self.compute_seconds + self._logs_overhead(
            steps_per_execution
        )
        extra = (
            (step_factor - 1) * compute
            + step_factor * self.collective_overhead / period
            - synchronous.collective_overhead
        )
        if extra <= 0:
            return math.inf
        return 8 * saved / extra


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
