"""The cost model's time per step, speed-up and break-even, against the
formulas worked by hand for the MLP of bench/wan.py."""

import math
import subprocess
import sys

import numpy as np
import pytest

from keras_clones import cost_model
from keras_clones.cost_model import StepCost
from keras_clones.cost_model import command as cost_model_command

MLP_BYTES = 1_077_288  # MLP 784-256-256-10 in float32.
MBIT_100 = 100e6


def mlp_cost(**overrides):
    values = dict(
        compute_seconds=0.003,
        hop_seconds=0.004,
        model_bytes=MLP_BYTES,
        workers=2,
    )
    values.update(overrides)
    return StepCost(**values)


def test_ring_bytes_through_one_shared_queue_and_through_each_card():
    # 2 workers share one queue: each sends its model once (reduce-scatter
    # and all-gather, half each), so the queue carries 2 models.
    assert cost_model.ring_bytes(MLP_BYTES, 2) == 2 * MLP_BYTES
    assert cost_model.ring_bytes(MLP_BYTES, 2, shared_link=False) == MLP_BYTES
    # 8 workers, own cards: 2 x 7 / 8 of the model each; shared: 14 models.
    assert cost_model.ring_bytes(800, 8, shared_link=False) == 1400
    assert cost_model.ring_bytes(800, 8) == 11200


def test_round_at_100_mbit_is_the_overhead_plus_two_models_of_bits():
    cost = mlp_cost()
    # 2 (n - 1) = 2 ring steps of 4 ms, plus 2 x 1,077,288 bytes at 1e8 b/s.
    assert cost.round_seconds(MBIT_100) == pytest.approx(
        0.008 + 8 * 2 * MLP_BYTES / 1e8
    )
    assert cost.round_seconds(MBIT_100) == pytest.approx(0.18036608)
    assert cost.round_seconds(None) == pytest.approx(0.008)


def test_step_time_is_compute_plus_a_periods_share_of_the_round():
    cost = mlp_cost()
    synchronous = cost.step_seconds(1, MBIT_100)
    assert synchronous == pytest.approx(0.003 + 0.18036608)
    agn = cost.step_seconds(64, MBIT_100, steps_per_execution=40)
    assert agn == pytest.approx(0.003 + 0.18036608 / 64 + 0.008 / 40)


def test_a_token_bucket_passes_its_burst_once_it_has_refilled():
    cost = mlp_cost()
    burst = 256 * 1024
    # Idle long enough to refill: the burst passes at once.
    full = cost.round_seconds(MBIT_100, burst_bytes=burst)
    assert full == pytest.approx(0.008 + 8 * (2 * MLP_BYTES - burst) / 1e8)
    # 3 ms idle at 100 Mbit/s refill 37,500 bytes of it.
    part = cost.round_seconds(MBIT_100, burst_bytes=burst, idle_seconds=0.003)
    assert part == pytest.approx(0.008 + 8 * (2 * MLP_BYTES - 37500) / 1e8)
    # A step's round idles for its period's compute: 64 x 3 ms.
    step = cost.step_seconds(64, MBIT_100, burst_bytes=burst)
    assert step == pytest.approx(0.003 + full / 64)
    # A burst larger than the round: the overhead alone.
    assert cost.round_seconds(MBIT_100, burst_bytes=1e9) == pytest.approx(0.008)


def test_speed_up_counts_agns_extra_steps():
    cost = mlp_cost()
    expected = (0.003 + 0.18036608) / (1.5 * (0.003 + 0.18036608 / 64))
    assert cost.speed_up(64, MBIT_100, 1.5) == pytest.approx(expected)
    assert cost.speed_up(64, MBIT_100, 1.5) == pytest.approx(21.01, abs=0.01)
    # The logs' collective once per execution slows both alike.
    logs = 0.008 / 40
    expected = (0.003 + logs + 0.18036608) / (
        1.5 * (0.003 + logs + 0.18036608 / 64)
    )
    assert cost.speed_up(64, MBIT_100, 1.5, 40) == pytest.approx(expected)


def test_break_even_period_is_the_shortest_that_wins_strictly():
    # Compute 1 s, a round of 2 s: AGN at 1.5x the steps ties at period 2
    # (1.5 x (1 + 2 / 2) = 1 + 2), so period 3 is the first that wins.
    tie = StepCost(1.0, 1.0, 1000, 2)
    assert tie.speed_up(2, None, 1.5) == pytest.approx(1.0)
    assert tie.break_even_period(None, 1.5) == 3
    assert tie.speed_up(3, None, 1.5) > 1
    # With no extra steps any period above synchronous training's wins.
    assert tie.break_even_period(None, 1.0) == 2


def test_break_even_period_at_100_mbit():
    cost = mlp_cost()
    # p >= 1.5 R / (R - 0.5 c) = 1.5 x 0.18037 / 0.17887 = 1.51: period 2.
    assert cost.break_even_period(MBIT_100, 1.5) == 2
    assert cost.speed_up(2, MBIT_100, 1.5) > 1 > cost.speed_up(1, MBIT_100, 1.5)
    # A round cheaper than the extra compute: no period wins.
    free = mlp_cost(hop_seconds=0.0)
    assert free.break_even_period(None, 1.5) is None
    # A slow step and a fast round: R = 8 ms, c = 100 ms, s = 1.05: margin
    # 8 - 5 = 3 ms, p >= 1.05 x 8 / 3 = 2.8: period 3.
    slow = mlp_cost(compute_seconds=0.1)
    assert slow.break_even_period(None, 1.05) == 3
    assert slow.speed_up(3, None, 1.05) > 1 > slow.speed_up(2, None, 1.05)


def test_break_even_bandwidth_solves_for_the_link():
    # Without overhead: AGN at p=64 with 1.5x the steps wins once a round
    # costs 0.5 x 3 ms x 64 / 62.5 = 1.536 ms: 17.24 Mbit of ring traffic
    # in 1.536 ms is 11.22 Gbit/s.
    free = mlp_cost(hop_seconds=0.0)
    bandwidth = free.break_even_bandwidth(64, 1.5)
    assert bandwidth == pytest.approx(8 * 2 * MLP_BYTES / 0.001536)
    assert free.speed_up(64, bandwidth, 1.5) == pytest.approx(1.0)
    assert free.speed_up(64, bandwidth / 2, 1.5) > 1
    # The 8 ms overhead alone is more than 1.536 ms: AGN wins on any link.
    assert mlp_cost().break_even_bandwidth(64, 1.5) == math.inf
    # A period no longer than the extra steps never wins.
    assert mlp_cost().break_even_bandwidth(1, 1.0) == 0.0
    assert mlp_cost().break_even_bandwidth(2, 2.0) == 0.0


def test_fit_recovers_compute_and_overhead_from_times_per_step():
    truth = mlp_cost()
    measurements = [
        (period, 40, truth.step_seconds(period, None, 40))
        for period in (1, 16, 64)
    ]
    fitted = cost_model.fit_step_cost(measurements, MLP_BYTES, 2)
    assert fitted.compute_seconds == pytest.approx(0.003)
    assert fitted.hop_seconds == pytest.approx(0.004)
    # On a shaped link, its transfer taken out.
    shaped = [
        (period, 40, truth.step_seconds(period, MBIT_100, 40))
        for period in (1, 4)
    ]
    fitted = cost_model.fit_step_cost(shaped, MLP_BYTES, 2, bandwidth=MBIT_100)
    assert fitted.compute_seconds == pytest.approx(0.003)
    assert fitted.hop_seconds == pytest.approx(0.004)


def test_numpy_numbers_are_numbers():
    cost = mlp_cost(workers=np.int64(8), model_bytes=np.float32(1e6))
    assert cost.step_seconds(np.int64(4), np.float64(1e9)) == pytest.approx(
        0.003 + (14 * 0.004 + 8 * 14e6 / 1e9) / 4  # 14 models shared.
    )


def test_parse_bandwidth_reads_tc_and_si_rates():
    assert cost_model.parse_bandwidth("100mbit") == 1e8
    assert cost_model.parse_bandwidth("1gbit") == 1e9
    assert cost_model.parse_bandwidth("10Mbit/s") == 1e7
    assert cost_model.parse_bandwidth("2.5g") == 2.5e9
    assert cost_model.parse_bandwidth("1e9") == 1e9


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: mlp_cost(workers=1), ValueError, "never synchronises"),
        (lambda: mlp_cost(workers=2.0), TypeError, "`workers` must be an"),
        (lambda: mlp_cost(compute_seconds=0), ValueError, "compute_seconds"),
        (lambda: mlp_cost(compute_seconds=True), TypeError, "of type bool"),
        (lambda: mlp_cost(compute_seconds=math.inf), ValueError, "finite"),
        (lambda: mlp_cost(hop_seconds=-1), ValueError, "hop_seconds"),
        (lambda: mlp_cost(hop_seconds=math.nan), ValueError, "hop_seconds"),
        (lambda: mlp_cost(model_bytes="1MB"), TypeError, "model_bytes"),
        (lambda: mlp_cost(shared_link="yes"), TypeError, "shared_link"),
        (lambda: mlp_cost().step_seconds(0, None), ValueError, "period"),
        (
            lambda: mlp_cost().step_seconds(4, None, steps_per_execution=0),
            ValueError,
            "steps_per_execution",
        ),
        (lambda: mlp_cost().speed_up(4, None, 0.5), ValueError, "at least 1"),
        (lambda: mlp_cost().round_seconds(0), ValueError, "bandwidth"),
        (
            lambda: mlp_cost().round_seconds(1e8, idle_seconds=-1),
            ValueError,
            "idle_seconds",
        ),
        (lambda: cost_model.ring_bytes(1000, 1), ValueError, "workers"),
        (
            lambda: cost_model.parse_bandwidth("100mbps"),
            ValueError,
            "multiply by 8",
        ),
        (lambda: cost_model.parse_bandwidth("1e999"), ValueError, "'1e999'"),
        (
            lambda: cost_model.fit_step_cost([(4, 40)], 1, 2),
            TypeError,
            r"measurements\[0\]",
        ),
        (
            lambda: cost_model.fit_step_cost(
                [(1, 40, 0.02), (0, 40, 0.01)], 1, 2
            ),
            ValueError,
            r"measurements\[1\]'s period",
        ),
        (
            lambda: mlp_cost().round_seconds(1e8, burst_bytes=-1),
            ValueError,
            "burst_bytes",
        ),
        (lambda: cost_model.parse_bandwidth("fast"), ValueError, "'fast'"),
        (
            lambda: cost_model.fit_step_cost([(4, 40, 0.01)], 1, 2),
            ValueError,
            "at least two different periods",
        ),
        (
            # Slower with a longer period: no positive compute fits.
            lambda: cost_model.fit_step_cost(
                [(1, 40, 0.001), (64, 40, 0.05)], 1, 2
            ),
            ValueError,
            "do not follow the model",
        ),
    ],
)
def test_bad_inputs_are_refused_with_what_to_pass(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_the_command_prints_times_and_break_even_without_tensorflow():
    result = subprocess.run(
        [
            sys.executable,
            *("-X", "importtime", "-m", "keras_clones.cost_model"),
            *("--model-bytes", str(MLP_BYTES), "--compute-ms", "3"),
            *("--hop-ms", "4", "--workers", "2", "--bandwidth", "100mbit"),
            *("--period", "64", "--step-factor", "1.5"),
            *("--steps-per-execution", "40"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "tensorflow" not in result.stderr  # -X importtime's list.
    assert "keras_clones" in result.stderr
    out = result.stdout
    assert "round (one all-reduce): 180.4 ms" in out, out
    # With the logs' collective, 8 ms / 40, in each step.
    assert "synchronous: 183.57 ms per step" in out, out
    assert "AGN period 64: 6.02 ms per step" in out, out
    assert "synchronous / AGN (x1.5 the steps): 20.33" in out, out
    assert "break-even period at this bandwidth: 2" in out, out
    assert "AGN period 64 is faster below: any bandwidth" in out, out


def test_the_command_refuses_a_bad_bandwidth_in_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "keras_clones.cost_model"]
        + ["--model-bytes", "1", "--compute-ms", "3", "--workers", "2"]
        + ["--bandwidth", "-1gbit"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "python -m keras_clones.cost_model: error: --bandwidth must be above "
        "0, in bits per second. Received: -1gbit. Pass the link's rate with "
        "its unit, e.g. --bandwidth 1gbit."
    ), result.stderr


# The command line, run in this process.

ERROR = "python -m keras_clones.cost_model: error: "
MLP_ARGS = {
    "--model-bytes": "1077288",
    "--compute-ms": "3",
    "--workers": "8",
    "--bandwidth": "1gbit",
}


def command(capsys, *extra, **replaced):
    """Runs the command on the MLP's options, with `replaced` ones
    (`compute_ms="-200"`; None leaves one out) and `extra` arguments
    after them; its exit code, stdout and stderr."""
    options = dict(MLP_ARGS)
    for name, value in replaced.items():
        options["--" + name.replace("_", "-")] = value
    argv = [
        arg
        for flag, value in options.items()
        if value is not None
        for arg in (flag, value)
    ]
    try:
        code = cost_model_command.main(argv + list(extra))
    except SystemExit as exit:
        code = exit.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def refusal(capsys, *extra, **replaced):
    """The one error line of a refused command, its prefix taken off."""
    code, out, err = command(capsys, *extra, **replaced)
    assert (code, out) == (2, ""), err
    assert err.startswith("usage: python -m keras_clones.cost_model")
    last = err.splitlines()[-1]
    assert last.startswith(ERROR), err
    return last[len(ERROR) :]


def test_a_bare_number_bandwidth_is_refused_with_the_units_to_add(capsys):
    assert refusal(capsys, bandwidth="1000") == (
        "--bandwidth needs a unit (bit, kbit, mbit, gbit or tbit; '/s' "
        "optional): a bare number would be read as bits per second. "
        "Received: 1000. Pass e.g. --bandwidth 1000bit for 1 kbit/s, or "
        "--bandwidth 1000mbit for 1 Gbit/s."
    )
    assert refusal(capsys, bandwidth="2.5G") == (
        "--bandwidth needs a unit (bit, kbit, mbit, gbit or tbit; '/s' "
        "optional): a bare number would be read as bits per second. "
        "Received: 2.5G. Pass e.g. --bandwidth 2.5gbit for 2.5 Gbit/s."
    )


def test_a_negative_value_after_a_space_gets_the_options_own_message(
    capsys,
):
    # argparse alone takes "-1gbit" and "-2e3" for options ("expected one
    # argument") and passes "-200" on.
    message = (
        "--bandwidth must be above 0, in bits per second. Received: -1gbit. "
        "Pass the link's rate with its unit, e.g. --bandwidth 1gbit."
    )
    assert refusal(capsys, bandwidth="-1gbit") == message
    assert refusal(capsys, "--bandwidth=-1gbit", bandwidth=None) == message
    assert refusal(capsys, compute_ms="-200") == (
        "--compute-ms must be above 0 (one local step's compute on one "
        "worker, in milliseconds). Received: -200. Pass e.g. --compute-ms 3."
    )
    assert refusal(capsys, "--hop-ms", "-2e3") == (
        "--hop-ms must be at least 0 (per-collective overhead of one ring "
        "step, in milliseconds). Received: -2e3. Pass e.g. --hop-ms 4."
    )


@pytest.mark.parametrize(
    "replaced, message",
    [
        (
            {"bandwidth": "fast"},
            "--bandwidth must be the link's rate in bits per second, with its "
            "unit (bit, kbit, mbit, gbit or tbit; '/s' optional). Received: "
            "fast. Pass e.g. --bandwidth 100mbit or --bandwidth 1gbit.",
        ),
        (
            {"bandwidth": "100Mbps"},
            "--bandwidth takes bits per second (bit, kbit, mbit, gbit or "
            "tbit; '/s' optional), not byte rates or 'bps' (bits to some, "
            "bytes to tc). Received: 100Mbps. Pass e.g. --bandwidth 100mbit "
            "for 100 Mbit/s, or --bandwidth 800mbit if you mean 100 MB a "
            "second.",
        ),
        (
            {"bandwidth": "1e999gbit"},
            "--bandwidth must be finite, in bits per second. Received: "
            "1e999gbit. Pass the link's rate with its unit, e.g. --bandwidth "
            "1gbit.",
        ),
        (
            {"compute_ms": "3ms"},
            "--compute-ms must be a number (one local step's compute on one "
            "worker, in milliseconds). Received: 3ms. Pass e.g. --compute-ms "
            "3.",
        ),
        (
            {"compute_ms": "inf"},
            "--compute-ms must be finite (one local step's compute on one "
            "worker, in milliseconds). Received: inf. Pass e.g. --compute-ms "
            "3.",
        ),
        (
            {"workers": "1"},
            "--workers must be at least 2 (the number of workers; one worker "
            "never synchronises). Received: 1. Pass e.g. --workers 8.",
        ),
        (
            {"workers": "2.5"},
            "--workers must be a whole number (the number of workers; one "
            "worker never synchronises). Received: 2.5. Pass e.g. --workers "
            "8.",
        ),
        (
            {"period": "0"},
            "--period must be at least 1 (AGN's communication_period; 1 "
            "commits every step). Received: 0. Pass e.g. --period 64.",
        ),
        (
            {"step_factor": "0.5"},
            "--step-factor must be at least 1 (AGN's local steps to a target "
            "over synchronous training's). Received: 0.5. Pass e.g. "
            "--step-factor 1.5.",
        ),
        (
            {"steps_per_execution": "-1"},
            "--steps-per-execution must be at least 1 (the model's "
            "steps_per_execution). Received: -1. Pass e.g. "
            "--steps-per-execution 40.",
        ),
        (
            {"model_bytes": "0"},
            "--model-bytes must be above 0 (bytes per round, "
            "AGNOptimizer.bytes_per_round). Received: 0. Pass e.g. "
            "--model-bytes 1077288.",
        ),
        (
            {"synchronous_bytes": "-4"},
            "--synchronous-bytes must be above 0 (bytes synchronous "
            "training all-reduces a step: its float32 gradients, 4 x its "
            "parameters). Received: -4. Pass e.g. --synchronous-bytes "
            "1077288.",
        ),
    ],
)
def test_each_bad_value_is_refused_naming_the_option_and_the_value_as_typed(
    capsys, replaced, message
):
    assert refusal(capsys, **replaced) == message


def test_the_model_size_comes_from_one_of_model_bytes_and_params(capsys):
    assert refusal(capsys, "--params", "269322") == (
        "--model-bytes and --params both give the model's size: pass one. "
        "Received: --model-bytes 1077288 and --params 269322. Drop one of "
        "them."
    )
    assert refusal(capsys, model_bytes=None) == (
        "The model's size is missing. Received: neither --model-bytes nor "
        "--params. Pass --model-bytes BYTES (bytes per round, "
        "AGNOptimizer.bytes_per_round) or --params N (its parameters, with "
        "--dtype, float32 by default)."
    )
    assert refusal(capsys, "--dtype", "bfloat16") == (
        "--dtype sizes the parameters of --params; --model-bytes is bytes "
        "already. Received: --model-bytes 1077288 and --dtype bfloat16. Drop "
        "--dtype, or pass --params instead of --model-bytes."
    )
    assert refusal(capsys, model_bytes=None, params="1e3", dtype="fp16") == (
        "--dtype must be one of float32, bfloat16, float16, float64, int8, "
        "int4 (what a round sends each parameter as). Received: fp16. "
        "Pass e.g. --dtype bfloat16, or leave it out for float32."
    )
    assert refusal(capsys, model_bytes=None, params="1.5") == (
        "--params must be a whole number (the model's parameters). "
        "Received: 1.5. Pass e.g. --params 269322."
    )


def test_params_in_float32_are_the_same_model_as_its_bytes(capsys):
    code, by_bytes, _ = command(capsys)
    assert code == 0
    code, by_params, _ = command(capsys, model_bytes=None, params="269322")
    assert code == 0
    first, *rest = by_params.splitlines()
    assert first == (
        "model: 269,322 parameters x 4 bytes (float32) = 1,077,288 bytes a "
        "round"
    )
    assert by_bytes.splitlines()[0] == "model: 1,077,288 bytes a round"
    assert rest == by_bytes.splitlines()[1:]


def test_params_in_bfloat16_halve_the_rounds_transfer(capsys):
    code, out, _ = command(
        capsys, model_bytes=None, params="269322", dtype="bfloat16"
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        "model: 269,322 parameters x 2 bytes (bfloat16) = 538,644 bytes a round"
    )
    # 14 half models through a shared 1 Gbit/s: 8 x 14 x 538,644 / 1e9 s.
    assert lines[2] == "round (one all-reduce): 60.3 ms"


def test_the_output_says_which_link_model_was_used(capsys):
    code, shared, _ = command(capsys)
    assert code == 0
    assert shared.splitlines()[1] == (
        "link model: shared link, one 1 Gbit/s queue for all 8 workers, 14 "
        "models a round through it (--own-links: a 1 Gbit/s card per worker)"
    )
    # 8 x 14 x 1,077,288 bytes at 1e9 b/s.
    assert shared.splitlines()[2] == "round (one all-reduce): 120.7 ms"
    code, own, _ = command(capsys, "--own-links")
    assert code == 0
    assert own.splitlines()[1] == (
        "link model: own links, a 1 Gbit/s card per worker, 1.75 of a model "
        "a round through each (without --own-links: one queue shared by all)"
    )
    # 8 times less: 8 x 1.75 x 1,077,288 bytes at 1e9 b/s.
    assert own.splitlines()[2] == "round (one all-reduce): 15.1 ms"


@pytest.mark.parametrize(
    "typed, shown",
    [
        ("1000bit", "1 kbit/s"),
        ("100mbit", "100 Mbit/s"),
        ("10Mbit/s", "10 Mbit/s"),
        ("1 Gbit/s", "1 Gbit/s"),
        ("2.5gbit", "2.5 Gbit/s"),
    ],
)
def test_bandwidths_with_units_in_bits_are_read_as_tc_writes_them(
    capsys, typed, shown
):
    code, out, err = command(capsys, bandwidth=typed)
    assert code == 0, err
    assert out.splitlines()[1].startswith(
        f"link model: shared link, one {shown} queue for all 8 workers"
    )


def test_help_says_the_bandwidth_is_bits_per_second_with_a_unit(
    capsys, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "200")  # No line cut at a hyphen.
    with pytest.raises(SystemExit) as exit:
        cost_model_command.main(["--help"])
    assert exit.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "--bandwidth RATE the link's rate in bits per second, with its unit: "
        "100mbit, 1gbit, 1000bit (bit, kbit, mbit, gbit, tbit; '/s' "
        "optional; a bare number is refused); one link shared by all "
        "workers unless --own-links" in out
    )
    assert "--params N the model's parameters, instead of --model-bytes" in out
    assert "(AGNOptimizer's communication_dtype; default float32;" in out


def test_an_all_gather_sends_each_payload_to_every_other_worker():
    # The reduce-scatter form sends as a ring all-reduce: 2 (n - 1) / n of
    # the payload a card; an all-gather n - 1 payloads.
    for workers in (2, 3, 4):
        ring = cost_model.ring_bytes(100.0, workers, shared_link=False)
        gather = cost_model.ring_bytes(
            100.0, workers, shared_link=False, form="all-gather"
        )
        scatter = cost_model.ring_bytes(
            100.0, workers, shared_link=False, form="reduce-scatter"
        )
        assert scatter == ring == pytest.approx(200 * (workers - 1) / workers)
        assert gather == 100.0 * (workers - 1)
    # An all-gather is n - 1 ring steps, not 2 (n - 1).
    assert mlp_cost(workers=4, form="all-gather").collective_overhead == (
        3 * 0.004
    )


def test_int8_and_int4_params_travel_with_a_scale_per_128(capsys):
    # 269,322 numbers: 2,105 blocks of 128, a float32 scale each.
    code, out, _ = command(
        capsys,
        model_bytes=None,
        params="269322",
        dtype="int8",
        form="all-gather",
        workers="2",
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        "model: 269,322 parameters in int8 = 269,322 bytes + 8,420 bytes of "
        "scales = 277,742 bytes a round"
    )
    # 2 payloads through the shared queue: 8 x 2 x 277,742 / 1e9 s.
    assert lines[1].endswith(
        "(all-gather; --own-links: a 1 Gbit/s card per worker)"
    )
    assert lines[2] == "round (one all-gather): 4.4 ms"
    code, out, _ = command(
        capsys, model_bytes=None, params="269322", dtype="int4"
    )
    assert code == 0
    assert out.splitlines()[0] == (
        "model: 269,322 parameters in int4 = 134,661 bytes + 8,420 bytes of "
        "scales = 143,081 bytes a round"
    )
    assert out.splitlines()[2].startswith("round (one reduce-scatter): ")
    # Synchronous training all-reduces float32 gradients: 8 workers through
    # a shared 1 Gbit/s, 14 float32 models, 8 x 14 x 1,077,288 bits a
    # step, and 3 ms of compute (no hops by default).
    assert out.splitlines()[3] == (
        "synchronous: 123.66 ms per step (float32 gradients all-reduced: "
        "1,077,288 bytes a step)"
    )


def test_model_bytes_with_synchronous_bytes_predict_as_params_do(capsys):
    # AGN's int4 rounds (`bytes_per_round`) against float32 synchronous
    # training: as `--params` with `--dtype int4` says it.
    int4 = {"model_bytes": None, "params": "269322", "dtype": "int4"}
    code, by_params, _ = command(capsys, **int4)
    assert code == 0
    code, by_bytes, _ = command(
        capsys,
        "--synchronous-bytes",
        "1077288",
        model_bytes="143081",
        form="reduce-scatter",
    )
    assert code == 0
    lines, expected = by_bytes.splitlines(), by_params.splitlines()
    assert lines[0] == "model: 143,081 bytes a round"
    assert lines[3] == expected[3].replace(
        "float32 gradients", "--synchronous-bytes"
    )
    assert lines[1:3] + lines[4:] == expected[1:3] + expected[4:]
    # Without it, synchronous training sends the round's 143,081 bytes: 14
    # of them through the shared 1 Gbit/s, 16.03 ms, and 3 ms of compute.
    code, alike, _ = command(capsys, model_bytes="143081")
    assert alike.splitlines()[3] == "synchronous: 19.03 ms per step"
    assert refusal(capsys, "--synchronous-bytes", "1077288", **int4) == (
        "--synchronous-bytes goes with --model-bytes: with --params, "
        "synchronous training all-reduces its float32 gradients, 4 x the "
        "parameters. Received: --params 269322 and --synchronous-bytes "
        "1077288. Drop --synchronous-bytes, or pass --model-bytes instead "
        "of --params."
    )


@pytest.mark.parametrize(
    "dtype, form, message",
    [
        ("int8", "all-reduce", "Pass --form all-gather or --form reduce-"),
        ("bfloat16", "all-gather", "Leave --form out, or pass --dtype int8"),
        ("int8", "ring", "--form must be one of all-reduce, all-gather, "),
    ],
)
def test_a_form_the_dtype_does_not_travel_in_is_refused(
    capsys, dtype, form, message
):
    code, _, error = command(
        capsys, model_bytes=None, params="269322", dtype=dtype, form=form
    )
    assert code == 2
    assert message in error


def test_an_all_gather_of_params_without_dtype_is_refused_as_float32(capsys):
    # Without --dtype a round of --params is float32, which is all-reduced:
    # refused as `--dtype float32` is; `--model-bytes` may be all-gathered.
    params = {"model_bytes": None, "params": "269322", "form": "all-gather"}
    assert refusal(capsys, **params) == (
        "--dtype float32 (the default with --params) commits are "
        "all-reduced. Received: --form all-gather. Leave --form out, or pass "
        "--dtype int8 or int4."
    )
    assert refusal(capsys, dtype="float32", **params).startswith(
        "--dtype float32 commits are all-reduced. Received: --form all-gather."
    )
    code, out, _ = command(capsys, form="all-gather")
    assert code == 0 and "all-gather" in out


def int4_mlp_cost(**overrides):
    """The MLP's int4 commits (143,081 bytes a round, reduce-scattered),
    against synchronous training's float32 gradients."""
    values = dict(
        model_bytes=143_081, form="reduce-scatter", synchronous_bytes=MLP_BYTES
    )
    values.update(overrides)
    return mlp_cost(**values)


def test_synchronous_training_all_reduces_float32_whatever_agn_sends():
    cost = int4_mlp_cost()
    # Synchronous: 8 ms of hops and 2 float32 models through the queue;
    # AGN: 8 ms and 2 int4 payloads, once in 64 steps.
    synchronous = 0.003 + 0.008 + 8 * 2 * MLP_BYTES / 1e8
    agn = 0.003 + (0.008 + 8 * 2 * 143_081 / 1e8) / 64
    assert cost.synchronous.step_seconds(1, MBIT_100) == pytest.approx(
        synchronous
    )
    assert cost.step_seconds(64, MBIT_100) == pytest.approx(agn)
    assert cost.speed_up(64, MBIT_100, 1.5) == pytest.approx(
        synchronous / (1.5 * agn)
    )
    # Not the int4 synchronous training that sending alike would assume.
    alike = mlp_cost(model_bytes=143_081, form="reduce-scatter")
    assert alike.speed_up(64, MBIT_100, 1.5) < 0.5 * cost.speed_up(
        64, MBIT_100, 1.5
    )
    # None: as AGN's period 1.
    assert alike.synchronous is alike


@pytest.mark.parametrize(
    "hop_seconds, execution", [(0.0, None), (0.004, None), (0.004, 1)]
)
def test_the_break_evens_with_float32_synchronous_training_are_where_it_ties(
    hop_seconds, execution
):
    # A slow step (100 ms) and an all-gather of int8 commits on 4 workers
    # (3 ring steps a round; the logs' all-reduce, with
    # `steps_per_execution`, 6 in both): the break-evens are where
    # speed_up crosses 1, found by scanning.
    cost = mlp_cost(
        compute_seconds=0.1,
        hop_seconds=hop_seconds,
        model_bytes=277_742,
        workers=4,
        form="all-gather",
        synchronous_bytes=MLP_BYTES,
    )
    bandwidth = 1e9
    period = cost.break_even_period(bandwidth, 1.5, execution)
    assert period >= 2
    assert cost.speed_up(period, bandwidth, 1.5, execution) > 1
    assert cost.speed_up(period - 1, bandwidth, 1.5, execution) <= 1
    below = cost.break_even_bandwidth(64, 1.5, execution)
    assert math.isfinite(below)
    assert cost.speed_up(64, below, 1.5, execution) == pytest.approx(1.0)
    assert cost.speed_up(64, below * 0.99, 1.5, execution) > 1
    assert cost.speed_up(64, below * 1.01, 1.5, execution) < 1
    # Period 1 at twice the steps puts 2 x 3 int8 payloads a step through
    # the queue, more than the 2 x 3 / 4 float32 models of synchronous
    # training: no bandwidth is slow enough.
    assert cost.break_even_bandwidth(1, 2.0) == 0.0


def test_commits_in_fewer_bytes_can_win_at_every_step():
    # int4 at 10 Mbit/s with no extra steps: its period 1 (gradients sent
    # in int4 every step) already beats float32 synchronous training.
    cost = int4_mlp_cost()
    assert cost.speed_up(1, 1e7, 1.0) > 1
    assert cost.break_even_period(1e7, 1.0) == 1
    # Sending alike, period 1 is synchronous training: 2 at the least.
    assert mlp_cost().break_even_period(1e7, 1.0) == 2


def test_synchronous_bytes_must_be_a_positive_number():
    with pytest.raises(ValueError, match="`synchronous_bytes` must be > 0"):
        int4_mlp_cost(synchronous_bytes=0)
    with pytest.raises(TypeError, match="`synchronous_bytes` must be a numb"):
        int4_mlp_cost(synchronous_bytes="1e6")
