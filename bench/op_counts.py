"""Op counts of two traced graphs: AGN's `apply` and a CloneModel(2) step.

What it measures: the number of TensorFlow ops in two graphs, a measure of
the work a step's graph holds that does not depend on the machine:

(a) `AGNOptimizer(keras.optimizers.Adam(), 10).apply(grads, variables)`,
    traced in a `tf.function` that takes the gradients as arguments, on the
    variables of a 2-layer MLP 64-16-10 (built before the trace);
(b) one training step of a `CloneModel` with 2 clones on `/cpu:0` and
    `/cpu:1` (the CPU split into two logical devices before TensorFlow
    starts, as bench/clones.py does: `DeploymentConfig(num_clones=2)` alone
    would put the clones on GPUs), the CNN with BatchNormalization of
    bench/clones.py (conv16-bn-conv32-bn-dense10 on 28x28x1), compiled with
    `AGNOptimizer(Adam(), 10)` and sparse categorical crossentropy:
    `tf.function(model.train_step)` traced for a batch of unknown size
    (float32 images, int32 labels), after `optimizer.build`;
(b0) the same step compiled with SGD(0.01), as bench/clones.py compiles it:
    the graph that bench/RESULTS.md's earlier count of 790 was taken on.

How: only public API (Keras's `train_step`, `optimizer.apply`,
`tf.function(...).get_concrete_function`, `Graph.as_graph_def`), so the
counts keep their meaning across a refactor of keras_clones's internals. The
count of a graph is the nodes of its `GraphDef` plus, for every function in
its function library (cond branches, while bodies, nested functions: the
library is flat, so each appears once), the ops of that function's own
graph: one Placeholder per input and the nodes of its body. That is the
method that reproduces the earlier counts (489 for (a), 790 for (b0));
counting a function's body nodes without its inputs, or the top-level graph
alone, does not. With `--methods` the script prints those too, and the
count per call site (a function counted again wherever an op refers to it;
the same here, where every function is called once).

Two things move the count besides the code: the model's shapes
(`tf.zeros` of 1000 elements or more is a Fill and its shape, not a Const:
+2 ops for each such variable in (a); the MLP 64-16-10 has one, its
64x16 kernel, and so reproduces 489, where 64-128-10 gives 491 and 5-8-1
487) and the batch size of the traced step (a known batch of 128 folds
shapes: 734 instead of 790 for (b0)).

Usage:
    python bench/op_counts.py [--types] [--methods]
"""

import argparse
import collections
import os

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from clones import DEVICES  # noqa: E402
from clones import NUM_CLASSES  # noqa: E402
from clones import cnn_batch_norm  # noqa: E402
from clones import split_cpu  # noqa: E402
from harness import mlp_variables  # noqa: E402

import keras_clones  # noqa: E402

SEED = 0
PERIOD = 10
MLP_SHAPE = (64, 16, NUM_CLASSES)  # Inputs, hidden units, outputs.
IMAGE_SHAPE = (28, 28, 1)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--types",
        action="store_true",
        help="also print each graph's count per op type",
    )
    parser.add_argument(
        "--methods",
        action="store_true",
        help="also print the counts of the other counting methods",
    )
    return parser.parse_args()


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
    with BatchNormalization, compiled with `optimizer`."""
    keras.utils.set_random_seed(SEED)
    inputs = keras.Input(IMAGE_SHAPE)
    model = keras_clones.CloneModel(
        inputs,
        cnn_batch_norm(inputs),
        deployment=keras_clones.DeploymentConfig(devices=DEVICES),
    )
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)
    spec = (
        tf.TensorSpec((None, *IMAGE_SHAPE), tf.float32),
        tf.TensorSpec((None,), tf.int32),
    )
    return tf.function(model.train_step).get_concrete_function(spec).graph


def _called_functions(node, library):
    """The names of the library functions that `node` refers to: in
    function-valued attributes (cond branches, while bodies, calls) or as
    its op type (a direct call)."""
    names = [node.op] if node.op in library else []
    for attr in node.attr.values():
        if attr.HasField("func"):
            names.append(attr.func.name)
        if attr.HasField("list"):
            names.extend(f.name for f in attr.list.func)
    return [name for name in names if name in library]


def op_types(graph):
    """The count of each op type by the method of `op_count`."""
    graph_def = graph.as_graph_def()
    types = collections.Counter(node.op for node in graph_def.node)
    for function in graph_def.library.function:
        types.update(node.op for node in function.node_def)
        types["Placeholder"] += len(function.signature.input_arg)
    return types


def op_count(graph):
    """The ops of `graph` and of every function in its library, each
    function's as its own graph holds them (a Placeholder per input, then
    the body's nodes)."""
    return sum(op_types(graph).values())


def other_counts(graph):
    """The counts of the other methods tried, by name."""
    graph_def = graph.as_graph_def()
    library = {f.signature.name: f for f in graph_def.library.function}

    def per_call_site(nodes):
        count = 0
        for node in nodes:
            count += 1
            for name in _called_functions(node, library):
                function = library[name]
                count += len(function.signature.input_arg)
                count += per_call_site(function.node_def)
        return count

    top = len(graph_def.node)
    return {
        "top-level only": top,
        "with library bodies, no inputs": top
        + sum(len(f.node_def) for f in library.values()),
        "per call site, with inputs": per_call_site(graph_def.node),
        "library functions": len(library),
    }


def report(label, graph, args):
    print(f"{label}: {op_count(graph)} ops", flush=True)
    if args.methods:
        for method, count in other_counts(graph).items():
            print(f"    {method}: {count}")
    if args.types:
        for op, count in sorted(op_types(graph).items()):
            print(f"    {op}: {count}")


def main():
    args = parse_args()
    split_cpu()
    print(
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}; ops of the "
        "graph plus those of every library function (its inputs and body)."
    )
    mlp = "-".join(map(str, MLP_SHAPE))
    report(
        f"(a) AGNOptimizer(Adam, {PERIOD}).apply, MLP {mlp}",
        agn_apply_graph(),
        args,
    )
    report(
        f"(b) CloneModel(2) train_step, CNN+BN, AGNOptimizer(Adam, {PERIOD})",
        clone_step_graph(agn_adam()),
        args,
    )
    report(
        "(b0) CloneModel(2) train_step, CNN+BN, SGD(0.01) (bench/clones.py)",
        clone_step_graph(keras.optimizers.SGD(0.01)),
        args,
    )


if __name__ == "__main__":
    main()
