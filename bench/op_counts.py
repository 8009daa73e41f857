"""Op counts of two traced graphs: AGN's `apply` and a CloneModel(2) step.

The TensorFlow ops of `AGNOptimizer(Adam, 10).apply` on an MLP's variables
and of one `train_step` of a CloneModel(2) of bench/clones.py's CNN+BN:
the work a step's graph holds, whatever the machine. What and how:
docs/benchmarks/throughput.md#op_counts.

    python bench/op_counts.py [--types] [--methods]
"""

import collections
import os

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import clones  # noqa: E402
import harness  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from timing import mlp_variables  # noqa: E402

import keras_clones  # noqa: E402

SEED = 0
PERIOD = 10
MLP_SHAPE = (64, 16, clones.NUM_CLASSES)  # Inputs, hidden units, outputs.
IMAGE_SHAPE = (28, 28, 1)
FLAGS = [
    harness.Flag("--types", False, help="also each graph's count per op type"),
    harness.Flag(
        "--methods", False, help="also the counts of the other methods"
    ),
]


def agn_adam():
    return keras_clones.AGNOptimizer(keras.optimizers.Adam(), PERIOD)


def agn_apply_graph():
    """(a): the graph of `AGNOptimizer(Adam, 10).apply` on an MLP's
    variables, the gradients its arguments."""
    variables = mlp_variables(MLP_SHAPE, SEED)
    optimizer = agn_adam()
    optimizer.build(variables)

    @tf.function
    def apply(grads):
        optimizer.apply(grads, variables)

    specs = [tf.TensorSpec(v.shape, v.dtype) for v in variables]
    return apply.get_concrete_function(specs).graph


def clone_step_graph(optimizer):
    """(b): the graph of one `train_step` of a CloneModel(2) of the CNN
    with BatchNormalization, compiled with `optimizer`, for a batch of
    unknown size."""
    keras.utils.set_random_seed(SEED)
    inputs = keras.Input(IMAGE_SHAPE)
    model = keras_clones.CloneModel(
        inputs,
        clones.cnn(inputs, batch_norm=True),
        deployment=keras_clones.DeploymentConfig(devices=clones.DEVICES),
    )
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)
    spec = (
        tf.TensorSpec((None, *IMAGE_SHAPE), tf.float32),
        tf.TensorSpec((None,), tf.int32),
    )
    return tf.function(model.train_step).get_concrete_function(spec).graph


def op_types(graph):
    """The count of each op type: the graph's nodes, and for every
    function in its library, a Placeholder per input and its body's
    nodes."""
    graph_def = graph.as_graph_def()
    types = collections.Counter(node.op for node in graph_def.node)
    for function in graph_def.library.function:
        types.update(node.op for node in function.node_def)
        types["Placeholder"] += len(function.signature.input_arg)
    return types


def other_counts(graph):
    """The counts of the other methods tried, by name."""
    graph_def = graph.as_graph_def()
    library = {f.signature.name: f for f in graph_def.library.function}

    def called(node):
        """The library functions `node` refers to: in function-valued
        attributes (cond branches, while bodies, calls) or as its op."""
        names = [node.op]
        for attr in node.attr.values():
            if attr.HasField("func"):
                names.append(attr.func.name)
            if attr.HasField("list"):
                names.extend(f.name for f in attr.list.func)
        return [library[name] for name in names if name in library]

    def per_call_site(nodes):
        return sum(
            1
            + sum(
                len(f.signature.input_arg) + per_call_site(f.node_def)
                for f in called(node)
            )
            for node in nodes
        )

    top = len(graph_def.node)
    return {
        "top-level only": top,
        "with library bodies, no inputs": top
        + sum(len(f.node_def) for f in library.values()),
        "per call site, with inputs": per_call_site(graph_def.node),
        "library functions": len(library),
    }


def measure(args):
    """Per graph: its count, and those of `--methods` and `--types`."""
    clones.split_cpu()
    print(
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}; ops of the "
        "graph plus those of every library function (its inputs and body)."
    )
    mlp = "-".join(map(str, MLP_SHAPE))
    graphs = {
        f"(a) AGNOptimizer(Adam, {PERIOD}).apply, MLP {mlp}": agn_apply_graph,
        f"(b) CloneModel(2) train_step, CNN+BN, AGNOptimizer(Adam, {PERIOD})": (
            lambda: clone_step_graph(agn_adam())
        ),
        "(b0) CloneModel(2) train_step, CNN+BN, SGD(0.01) (bench/clones.py)": (
            lambda: clone_step_graph(keras.optimizers.SGD(0.01))
        ),
    }
    counts = {}
    for label, graph in graphs.items():
        graph = graph()
        types = op_types(graph)
        counts[label] = {
            "ops": sum(types.values()),
            "methods": other_counts(graph) if args.methods else {},
            "types": dict(sorted(types.items())) if args.types else {},
        }
    return counts


def report(counts, args):
    for label, count in counts.items():
        print(f"{label}: {count['ops']} ops")
        for name, n in [*count["methods"].items(), *count["types"].items()]:
            print(f"    {name}: {n}")


BENCHMARK = harness.Benchmark(__doc__, measure, report, flags=FLAGS)

if __name__ == "__main__":
    harness.run(BENCHMARK)
