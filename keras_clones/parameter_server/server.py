"""`python -m keras_clones.parameter_server.server`: one parameter server or
worker of the cluster `TF_CONFIG` describes, until it is stopped.

`python -m keras_clones.launch --ps N` starts these; the training script is
the coordinator. Each server gets `workers + 2` inter-op threads (fewer than
`workers + 1` deadlock a cluster on one machine).
"""

import tensorflow as tf


def main():
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    config = tf.compat.v1.ConfigProto(
        inter_op_parallelism_threads=spec.num_tasks("worker") + 2
    )
    server = tf.distribute.Server(
        spec,
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        config=config,
        start=True,
    )
    server.join()


if __name__ == "__main__":
    main()
