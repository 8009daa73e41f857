"""Parameter-server training in a child process; see
tests/test_parameter_server.py.

`OUT=DIR python ps_worker.py WORKERS PS SCENARIO...` starts an in-process
cluster (PS parameter servers and WORKERS workers, 2 CPUs each), runs each
scenario on it, and writes what the test asserts to DIR/SCENARIO.json.
The references (one process, no strategy) run here too, on the same
batches. The scenarios are in `ps_plain_scenarios.py`, `ps_agn_scenarios.py`
and `ps_in_flight_scenarios.py`, what they share in `ps_common.py`.
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import ps_agn_scenarios as agn  # noqa: E402
import ps_in_flight_scenarios as in_flight  # noqa: E402
import ps_plain_scenarios as plain  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_clones.parameter_server import InProcessCluster  # noqa: E402

SCENARIOS = {
    "one_worker": plain.one_worker,
    "agn_inner_optimizers": agn.agn_inner_optimizers,
    "agn_one_worker": agn.agn_one_worker,
    "resume": plain.resume,
    "inf_nan": in_flight.inf_nan,
    "sparse": plain.sparse,
    "two_workers": plain.two_workers,
    "delayed_nesterov": agn.delayed_nesterov,
    "refusals": plain.refusals,
    "in_flight": in_flight.in_flight,
    "two_parameter_servers": plain.two_parameter_servers,
    "overwritten": plain.overwritten,
    "placement_one_server": plain.placement,
    "steps_per_execution": in_flight.steps_per_execution,
    "agn_steps_per_execution": agn.agn_steps_per_execution,
    "placement_two_servers": plain.placement,
}

if __name__ == "__main__":
    # One cluster for all the scenarios named (a process has one).
    workers, ps = int(sys.argv[1]), int(sys.argv[2])
    cluster = InProcessCluster(
        num_workers=workers, num_ps=ps, cpus_per_server=2
    )
    strategy = tf.distribute.ParameterServerStrategy(cluster.resolver)
    for scenario in sys.argv[3:]:
        results = SCENARIOS[scenario](strategy)
        path = os.path.join(os.environ["OUT"], f"{scenario}.json")
        with open(path, "w") as f:
            json.dump(results, f)
