"""Fragmented commits of an `AGNOptimizer` (`fragments=F`): the model's
weights cut into F fragments of similar bytes, each committing at its own
step of the period, so that each all-reduce carries about 1/F of the model
(Streaming DiLoCo's fragments, arXiv 2501.18512).

The weights of the variables, in order and flattened, are cut at F equal
shares of the bytes, inside a variable where a cut falls there (in the
slow-link bench's MLP one kernel holds 75% of the weights). Fragment f
commits at local step `(f + 1) * period / F` of each period: its commit is
the rule's (`CommitRule.period_commit`) on its part of the accumulators,
centers and local weights; the workers' commits are all-reduced; the outer
optimizer moves its part of the centers; its part of the local weights
takes them, and its part of the accumulators restarts.

The outer optimizer meets fragments as F optimizers of its class and
config, each on one fragment (its state over that fragment's elements, its
own step count: the fragment's commits so far), run on tensors
(`tensor_optimizer.TensorOptimizer`); a learning-rate schedule is
evaluated at the fragment's step count, the periods it committed. So the
outer optimizer must update each element on its own (SGD, Adam, RMSprop,
Lion...: not Lamb, Muon or Adafactor, and without weight decay or norm
clipping, which look at whole variables).
"""

import keras
import numpy as np
import tensorflow as tf

from keras_clones import gradients
from keras_clones.step_hooks import Step
from keras_clones.tensor_optimizer import TensorOptimizer

# Outer optimizers that look at whole variables (norms, factored slots).
_NOT_ELEMENTWISE = ("Lamb", "Muon", "Adafactor")


class Fragments:
    """The weights of `variables` cut into `count` fragments of similar
    size, in order: fragment f is `pieces[f]`, a list of (variable index,
    first flat element, end)."""

    def __init__(self, variables, count):
        sizes = [int(np.prod(v.shape)) for v in variables]
        total = sum(sizes)
        bounds = [round(total * f / count) for f in range(count + 1)]
        self.pieces = []
        for low, high in zip(bounds, bounds[1:]):
            pieces, offset = [], 0
            for index, size in enumerate(sizes):
                start, end = max(low, offset), min(high, offset + size)
                if start < end:
                    pieces.append((index, start - offset, end - offset))
                offset += size
            self.pieces.append(pieces)
        self.sizes = [high - low for low, high in zip(bounds, bounds[1:])]

    def gather(self, fragment, values):
        """Fragment `fragment` of `values` (a tensor per variable), flat."""
        return tf.concat(
            [
                tf.reshape(values[index], [-1])[start:end]
                for index, start, end in self.pieces[fragment]
            ],
            0,
        )

    def replaced(self, fragment, variable, index, flat):
        """`variable`'s value (a tensor), with its part of fragment
        `fragment` taken from `flat` (the fragment's values), or None where
        the fragment has no part of variable `index`."""
        offset = 0
        for piece_index, start, end in self.pieces[fragment]:
            if piece_index == index:
                old = tf.reshape(variable, [-1])
                new = flat[offset : offset + end - start]
                value = tf.concat([old[:start], new, old[end:]], 0)
                return tf.reshape(value, tf.shape(variable))
            offset += end - start
        return None

    def touched(self, fragment):
        """The indices of the variables fragment `fragment` has a part of."""
        return [index for index, _, _ in self.pieces[fragment]]

    def assign_here(self, fragment, variables, flat):
        """Assigns `flat` to fragment `fragment` of `variables` on this
        replica (variables a replica holds alone: sums on read)."""
        for index in self.touched(fragment):
            variable = variables[index]
            variable.assign(
                self.replaced(fragment, variable.value, index, flat)
            )

    def assign(self, distribution, fragment, variables, flat):
        """Assigns `flat` (per replica, or the same) to fragment `fragment`
        of `variables`, each replica's own rest kept (cross-replica)."""
        for index in self.touched(fragment):

            def piece(var, flat, index=index):
                return var.assign(self.replaced(fragment, var, index, flat))

            distribution.extended.update(
                gradients.tf_variable(variables[index]),
                piece,
                args=(flat,),
                group=False,
            )


def check_outer_optimizer(outer_optimizer, fragments):
    """Refuses an outer optimizer that cannot run on fragments."""
    if fragments == 1:
        return
    name = type(outer_optimizer).__name__
    problem = None
    if name in _NOT_ELEMENTWISE:
        problem = f"{name} looks at whole variables"
    for option in ("weight_decay", "clipnorm", "global_clipnorm"):
        if getattr(outer_optimizer, option, None):
            problem = f"its `{option}` looks at whole variables"
    if problem:
        raise ValueError(
            f"With `fragments={fragments}` the outer optimizer runs on each "
            "fragment's part of the centers, element by element, but "
            f"{problem}. Pass an `outer_optimizer` without it (e.g. "
            "`keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)`), or "
            "`fragments=1`."
        )


class FragmentedCommits:
    """Part of `AGNOptimizer`'s class: its commits with `fragments` > 1.
    It reads the optimizer's `commit_rule`, centers, accumulators,
    `_local_step` and `_communication_rounds`; `_build_fragments` adds its
    own state (per fragment, the outer optimizer's)."""

    def _cut_into_fragments(self, variables):
        """The fragments' geometry (also one fragment, the whole model, for
        `overlap=True`), over the variables that have centers."""
        dtypes = {tf.as_dtype(v.dtype) for v in variables}
        if len(dtypes) > 1 or len(variables) == 0:
            raise ValueError(
                "`fragments` and `overlap=True` need the trainable variables "
                "to have one dtype, but they have the dtypes "
                f"{sorted(d.name for d in dtypes)}. Use `fragments=1` and "
                "`overlap=False`."
            )
        self._fragments = Fragments(variables, self.fragments)
        if min(self._fragments.sizes) == 0:
            raise ValueError(
                f"`fragments={self.fragments}` is more than the model's "
                f"{sum(self._fragments.sizes)} weights. Use fewer fragments."
            )
        self._fragmented = variables

    def _build_fragments(self, variables):
        """Each fragment's own state of the outer optimizer."""
        self._fragment_outer, self._fragment_states = [], []
        for f, size in enumerate(self._fragments.sizes):
            dtype = tf.as_dtype(variables[0].dtype).as_numpy_dtype
            flat = keras.Variable(np.zeros(size, dtype), name=f"fragment_{f}")
            outer = TensorOptimizer(
                self.outer_optimizer,
                [flat],
                f"With `fragments={self.fragments}` an AGNOptimizer runs its "
                "outer optimizer on each fragment",
            )
            self._fragment_outer.append(outer)
            self._fragment_states.append(
                [
                    self._add_fragment_state(f, template)
                    for template in outer.state_templates
                ]
            )

    def _add_fragment_state(self, fragment, template):
        state = self.add_variable(
            shape=template.shape,
            dtype=template.dtype,
            name=f"fragment_{fragment}_outer_{template.name.split('/')[-1]}",
        )
        state.assign(template.numpy())
        return state

    @property
    def _fragment_share(self):
        """Steps between two fragments' period ends."""
        return self.communication_period // self.fragments

    def _fragment_ending_at(self, step):
        """The fragment whose period ends at local step `step` (a tensor),
        or -1: fragment f's ends at step (f + 1) * share of each period."""
        share = self._fragment_share
        position = step % self.communication_period
        fragment = (position // share - 1) % self.fragments
        return tf.where(tf.equal(position % share, 0), fragment, -1)

    def _for_fragment(self, fragment, fn):
        """`fn(f)` for the fragment `fragment` (a tensor; none for -1)."""
        for f in range(self.fragments):
            tf.cond(tf.equal(fragment, f), lambda f=f: fn(f), lambda: None)

    def _count_fragmented_step(self, distribution, step_hooks):
        self._for_fragment(
            self._fragment_ending_at(self._local_step.value),
            lambda f: self._synchronise_fragment(distribution, f, step_hooks),
        )

    def _synchronise_fragment(self, distribution, fragment, step_hooks):
        self._communication_rounds.assign_add(1)
        distribution.extended.call_for_each_replica(
            self._commit_fragment_on_replica, args=(fragment, step_hooks)
        )
        # The fragment of the local weights takes the (same) centers.
        centers = [self.global_center_variable(v) for v in self._fragmented]
        flat = self._fragments.gather(fragment, [c.value for c in centers])
        self._fragments.assign(distribution, fragment, self._fragmented, flat)

    def _commit_fragment_on_replica(self, fragment, step_hooks):
        """The workers' mean commit of `fragment`, moving its part of the
        centers (guarded); its part of the accumulators restarts."""
        centers = [self.global_center_variable(v) for v in self._fragmented]
        commit = self._fragment_commit(fragment, centers)
        reduced = self._all_reduce([commit])[0]
        if step_hooks is not None:
            step_hooks.count_deferred_skips()
        self._move_fragment_centers(fragment, reduced, step_hooks)
        self._restart_accumulators(fragment)

    def _fragment_commit(self, fragment, starts):
        """This replica's commit of `fragment`, flat, by the rule: from its
        part of the accumulators, or of `starts` (a variable per variable
        of the fragments; None for the gradients rule) and the local
        weights."""
        values = self._fragments.gather
        end = values(
            fragment, [gradients.tf_variable(v) for v in self._fragmented]
        )
        start = None
        if starts is not None:
            start = values(fragment, [s.value for s in starts])
        gradient_sum = None
        if self._accumulates:
            gradient_sum = values(
                fragment,
                [self.grad_variable(v).value for v in self._fragmented],
            )
        return self.commit_rule.period_commit(gradient_sum, start, end)

    def _restart_accumulators(self, fragment):
        if not self._accumulates:
            return
        accumulators = [self.grad_variable(v) for v in self._fragmented]
        zeros = tf.zeros(
            [self._fragments.sizes[fragment]], accumulators[0].dtype
        )
        self._fragments.assign_here(fragment, accumulators, zeros)

    def _move_fragment_centers(self, fragment, reduced, step_hooks):
        """In a replica: the reduced commit of `fragment` (flat) moves its
        part of the centers, through the guard of `step_hooks`: the outer
        optimizer itself for the whole model, else the fragment's own."""
        centers = [self.global_center_variable(v) for v in self._fragmented]
        if self.fragments == 1:
            shapes = [tf.shape(c.value) for c in centers]
            sizes = [int(np.prod(c.shape)) for c in centers]
            commits = [
                tf.reshape(part, shape)
                for part, shape in zip(tf.split(reduced, sizes), shapes)
            ]

            def move_centers():
                self.commit_rule.move_centers(
                    self.outer_optimizer, commits, centers
                )

            step = Step(commits, centers, skip_agreement="none")
        else:

            def move_centers():
                state = [s.value for s in self._fragment_states[fragment]]
                outer = self._fragment_outer[fragment]
                start = self._fragments.gather(
                    fragment, [c.value for c in centers]
                )
                (moved,), state = outer.step(
                    [start], [reduced], state, outer.iteration(state)
                )
                tf.distribute.get_replica_context().merge_call(
                    self._assign_centers, args=(fragment, moved, state)
                )

            first = centers[self._fragments.touched(fragment)[0]]
            step = Step([reduced], [first], skip_agreement="none")
        if step_hooks is None:
            move_centers()
        else:
            step_hooks.guarded(step, move_centers)

    def _assign_centers(self, distribution, fragment, moved, state):
        centers = [self.global_center_variable(v) for v in self._fragmented]
        self._fragments.assign(distribution, fragment, centers, moved)
        for index in self._fragments.touched(fragment):
            center = centers[index]
            if center.constraint is not None:
                gradients.assign_in_cross_replica(
                    distribution, center, center.constraint(center.value)
                )
        for variable, value in zip(self._fragment_states[fragment], state):
            gradients.assign_in_cross_replica(distribution, variable, value)
