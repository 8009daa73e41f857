"""An `AGNOptimizer`'s training step in parts (`begin_local_step`,
`apply_local`, `end_local_step`, which `apply` runs in turn), and the
synchronisation at the end of a period, in one process and across workers;
and the seam of parameter-server periods, which take the local steps
elsewhere (`start_centers_from_variables`, `apply_commit`).
"""

import tensorflow as tf

from keras_clones import _keras_internals as internals
from keras_clones import gradients
from keras_clones import optimizer_capabilities
from keras_clones.multi_worker import collectives
from keras_clones.multi_worker import topology
from keras_clones.step_hooks import Step


def _replica_context():
    """The replica context `apply` runs in; refuses where AGN cannot."""
    strategy = tf.distribute.get_strategy()
    multi_worker = isinstance(
        strategy, tf.distribute.MultiWorkerMirroredStrategy
    )
    devices = len(strategy.extended.worker_devices) if multi_worker else 1
    if strategy.num_replicas_in_sync > devices > 1:
        raise NotImplementedError(
            "AGNOptimizer trains across workers with one replica per "
            f"worker, but this worker has {devices} devices. Give each "
            "worker one device (the default CPU) and split its batch "
            "across its devices with a CloneModel."
        )
    replica_context = tf.distribute.get_replica_context()
    if replica_context is None:
        raise ValueError(
            "AGNOptimizer.apply() must be called in a replica context, "
            "e.g. inside `strategy.run`, as `fit` does."
        )
    return replica_context


class AGNSteps:
    """The step of `AGNOptimizer` (a part of its class): what it does with
    its centers, accumulators and counters each step and at each period's
    end, by its `commit_rule`. It reads the state `agn.py` builds:
    `global_center_variable`, `grad_variable`, `_local_step`,
    `_communication_rounds`, `_accumulates` (whether gradients are
    accumulated) and `_step_hooks`."""

    def start_centers_from_variables(self, var_list):
        """On the first step only (`local_step` still 0), copies each
        variable into its global center, as `begin_local_step` does: the
        reverse of `assign_global_centers`. For training that takes local
        steps elsewhere (parameter-server training)."""
        if self.overlap or self.fragments > 1:
            raise ValueError(
                "`overlap=True` and `fragments` > 1 do not apply to "
                "parameter-server training: there each worker's period "
                "already runs apart from the others', and the coordinator "
                "applies its whole commit when it arrives. Create the "
                "AGNOptimizer with `overlap=False` and `fragments=1`."
            )
        self.build(var_list)
        if int(self._local_step.numpy()) == 0:
            for variable in var_list:
                self.global_center_variable(variable).assign(variable)

    def apply_commit(self, commit, var_list, step_hooks=None, applied=None):
        """Applies one period's `commit` (a gradient per variable, by this
        optimizer's `commit` rule) taken elsewhere: the outer optimizer
        updates the centers of `var_list`, through the hooks of
        `step_hooks` (a guard may skip it), and the variables then take the
        centers' values; `iterations`, `local_step` and
        `communication_rounds` count the period, as `apply` counts them.
        For parameter-server training, where each worker's period runs on
        its own copy of the weights; call it for one commit at a time.

        Args:
            commit: One tensor per variable of `var_list`.
            var_list: The model's trainable variables.
            step_hooks: The `keras_clones.step_hooks.StepHooks` whose
                hooks see the commit (the model's); by default none.
            applied: With a period of 1, whether its one local step applied
                (a guard's verdict): a skipped step commits nothing, and
                still counts. None: it applied.
        """
        centers = [self.global_center_variable(v) for v in var_list]

        def move_centers():
            self.commit_rule.move_centers(self.outer_optimizer, commit, centers)

        def commit_to_centers():
            self._communication_rounds.assign_add(1)
            if step_hooks is None:
                move_centers()
            else:
                step_hooks.run(
                    Step(commit, centers, skip_agreement="none"), move_centers
                )
            for variable, center in zip(var_list, centers):
                variable.assign(center)

        if applied is None or self.skips_alone:
            commit_to_centers()
        else:
            tf.cond(applied, commit_to_centers, lambda: None)
        self._local_step.assign_add(self.communication_period)
        internals.increment_iterations(self, self.communication_period)

    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:
            if not self.built:
                raise ValueError(
                    "When passing `grads` without `trainable_variables`, the "
                    "optimizer must already be built."
                )
            trainable_variables = internals.built_variables(self)
        _replica_context()  # Checks where it is called.
        trainable_variables = list(trainable_variables)
        grads = list(grads)
        self.build(trainable_variables)
        pairs = gradients.with_gradients(grads, trainable_variables)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        optimizer_capabilities.apply_in_parts(
            self, self._step_hooks, Step(grads, variables)
        )

    def begin_local_step(self, trainable_variables):
        """Before `apply_local`, on every worker and never skipped: on the
        first step the centers take the model's values (weights loaded after
        `build` are the ones to train from), also on a worker whose first
        local step a guard skips.

        Args:
            trainable_variables: The variables, as for `apply`.
        """
        replica_context = _replica_context()
        self.build(trainable_variables)
        variables = [
            v for v in trainable_variables if not gradients.overwrites(v)
        ]
        replica_context.merge_call(self._start_from_model, args=(variables,))

    def apply_local(self, grads, trainable_variables):
        """The middle part of `apply`: this worker's local step.

        The inner optimizer updates the variables, and the gradients are
        accumulated; the step is not counted and nothing is synchronised
        (`end_local_step` does both); `begin_local_step` comes first. A
        `CloneModel` calls the parts itself, so that across workers its
        `InfNanCheck` skips a non-finite local step on its own worker only,
        with no communication.

        Args:
            grads: The gradients, as for `apply`.
            trainable_variables: The variables, as for `apply`.
        """
        _replica_context()  # Checks where it is called.
        self.build(trainable_variables)
        grads, variables = gradients.overwrite_with_gradients(
            *zip(
                *gradients.with_gradients(
                    grads, trainable_variables, warn=False
                )
            )
        )
        strategy = tf.distribute.get_strategy()
        workers = strategy.num_replicas_in_sync
        if workers > 1 and topology.one_replica_per_worker(strategy):
            # Workers train locally between synchronisations, each on the
            # gradient of its own batch (Keras divides it by the workers).
            with internals.without_gradient_all_reduce(self.inner_optimizer):
                self.inner_optimizer.apply(
                    [collectives.scaled(g, workers) for g in grads], variables
                )
        else:
            self.inner_optimizer.apply(grads, variables)
        if self._accumulates:
            for variable, grad in zip(variables, grads):
                self.grad_variable(variable).assign_add(
                    tf.convert_to_tensor(grad)
                )

    def end_local_step(
        self, grads, trainable_variables, step_hooks=None, applied=None
    ):
        """The last part of `apply`, never skipped: counts the step (a
        skipped one too), and commits at the end of a period.

        The commit (see `commit`) of every worker is averaged in one
        all-reduce, in `communication_dtype`; the outer optimizer applies
        the result to the global centers, and every variable takes its
        center. The result is the same on every worker, so when the guard
        of `step_hooks` skips it (it is not finite), every worker skips it
        alike, and the centers stay as they were. With a period of 1 the
        commit is the step itself: a step the guard skipped (`applied`
        false) commits nothing, on every worker (see `skips_alone`).

        Args:
            grads: The step's gradients, as for `apply` (a one-step period
                with `commit="gradients"` commits them).
            trainable_variables: The variables, as for `apply`.
            step_hooks: The `keras_clones.step_hooks.StepHooks` whose guard
                may skip the commit (the caller's own); by default none.
            applied: Whether the guard applied the local step (a boolean
                tensor, the same on every worker when not `skips_alone`),
                or None (no guard).
        """
        replica_context = _replica_context()
        pairs = gradients.with_gradients(grads, trainable_variables, warn=False)
        pairs = [(g, v) for g, v in pairs if not gradients.overwrites(v)]
        replica_context.merge_call(
            self._count_step, args=(pairs, step_hooks, applied)
        )
        internals.increment_iterations(self)

    @property
    def skips_alone(self):
        """Whether a worker skips a non-finite local step alone, the skips
        counted at the commit (`Step.skip_agreement="deferred"`). Not at a
        period of 1, where every step commits: there the workers skip a
        step together, as in synchronous training."""
        return self.communication_period > 1

    def _start_from_model(self, distribution, variables):
        # Weights loaded after `build` are the ones to train from.
        def copy_model_into_centers():
            for variable in variables:
                center = self.global_center_variable(variable)
                gradients.assign_in_cross_replica(
                    distribution, center, variable
                )
                if self.overlap and self.commit == "weight_change":
                    start = self.period_start(variable)
                    gradients.assign_in_cross_replica(
                        distribution, start, variable
                    )

        tf.cond(
            tf.equal(self._local_step, 0),
            copy_model_into_centers,
            lambda: None,
        )

    def _count_step(self, distribution, pairs, step_hooks, applied):
        self._local_step.assign_add(1)
        if self.overlap:
            self._count_overlapped_step(distribution, step_hooks)
            return
        if self.fragments > 1:
            self._count_fragmented_step(distribution, step_hooks)
            return
        if self.communication_period > 1:
            commits = tf.equal(self._local_step % self.communication_period, 0)
        elif applied is not None:  # The step is the commit (agreed).
            commits = distribution.experimental_local_results(applied)[0]
        else:
            self._synchronise(distribution, pairs, step_hooks)
            return
        tf.cond(
            commits,
            lambda: self._synchronise(distribution, pairs, step_hooks),
            lambda: None,
        )

    def _synchronise(self, distribution, pairs, step_hooks):
        self._communication_rounds.assign_add(1)
        distribution.extended.call_for_each_replica(
            self._commit_on_replica, args=(pairs, step_hooks)
        )
        for _, variable in pairs:
            gradients.assign_in_cross_replica(
                distribution, variable, self.global_center_variable(variable)
            )

    def _commit_on_replica(self, pairs, step_hooks):
        """The workers' mean commit, applied to the centers (guarded)."""
        centers = [self.global_center_variable(v) for _, v in pairs]
        mean = self._all_reduce([self._commit(g, v) for g, v in pairs])

        def move_centers():
            self.commit_rule.move_centers(self.outer_optimizer, mean, centers)

        if step_hooks is None:
            move_centers()
        else:
            if self.skips_alone:
                step_hooks.count_deferred_skips()
            step_hooks.guarded(
                Step(mean, centers, skip_agreement="none"), move_centers
            )
        if self._accumulates:
            for _, variable in pairs:
                accumulator = self.grad_variable(variable)
                accumulator.assign(tf.zeros_like(accumulator))

    def _commit(self, grad, variable):
        """What this replica sends for `variable` at the end of a period."""
        if self.commit == "gradients" and self.communication_period == 1:
            # A one-step period's mean gradient is the gradient itself: the
            # outer optimizer takes it as it is (sparse stays sparse), as
            # the bare optimizer would.
            return grad
        gradient_sum = None
        if self.commit == "gradients":
            gradient_sum = self.grad_variable(variable).value
        center = self.global_center_variable(variable)
        return self.commit_rule.period_commit(gradient_sum, center, variable)

    def _all_reduce(self, values):
        """Every replica's commits, reduced by the rule (a sum of gradients
        Keras has divided by the replicas, a mean of weight changes), in
        `communication_dtype`."""
        rule = self.commit_rule
        reduced = tf.distribute.get_replica_context().all_reduce(
            rule.reduce_op, rule.to_send(values)
        )
        return rule.received(reduced, [v.dtype for v in values])
