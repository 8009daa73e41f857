"""The multi-worker throughput benchmark runs and prints its tables."""

import importlib.util
import pathlib
import re

ROOT = pathlib.Path(__file__).parent.parent


def test_bench_multiworker_quick_prints_ratios_and_rounds(run_bench_quick):
    out = run_bench_quick("multiworker", timeout=180)
    ratio = r"\| [0-9.]+ \| [0-9.]+ \|"
    assert re.search(rf"\| keras_clones 2w / keras_clones 1w {ratio}", out), out
    assert re.search(rf"\| AGN\(10\) 2w / keras_clones 2w {ratio}", out), out
    assert re.search(rf"\| AGN\(10\) 2w x10 / AGN\(10\) 2w {ratio}", out), out
    # One all-reduce per period: 10 and 100 per 100 steps, and their time.
    time = r"[0-9.-]+ \| -?[0-9]+% \|"
    assert re.search(rf"\| AGN\(10\) 2w \| 10\.0 \|.* \| {time}", out), out
    assert re.search(rf"\| AGN\(1\) 2w \| 100\.0 \|.* \| {time}", out), out
    if importlib.util.find_spec("tf_keras") is None:
        assert "tf-keras variants are skipped" in out, out
        assert re.search(r"\| keras_clones 2w / tf-keras 2w \| n/a", out)
    else:
        assert re.search(rf"\| keras_clones 2w / tf-keras 2w {ratio}", out)
        assert re.search(rf"\| AGN\(10\) 2w x10 / tf-keras 2w {ratio}", out)
        assert re.search(rf"\| AGN\(10\) 2w x10 / tf-keras 2w x10 {ratio}", out)
