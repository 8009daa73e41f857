"""The outer rule of whole variables: the outer optimizer (a Keras
optimizer) applies each reduced commit to the centers as a gradient,
through its stateful `apply`, as it would to a model's variables (the
default; measured faster than on values on TensorFlow).

Every outer rule (this one, `slice_outer.SliceOuter`,
`delayed_nesterov.DelayedNesterov`) has:

- `state_variables`: its own state, made by the `AGNOptimizer`'s
  `add_variable` (saved with it), and `state_saved_last`: whether that
  state is saved after the rest, so that a file without it loads (the
  state then restarts);
- `variables`: every variable its move may assign;
- `move(fragment, reduced, replicas, applied)`: the reduced commit moves
  the fragment's centers, unless `applied` (a guard's verdict, a boolean
  scalar; None: always) is false;
- for whole variables, `on_worker(centers, where)`: the rule on values
  that a worker replaying its own commits (parameter servers) runs, as a
  `TensorOptimizer` (`read_source_state`, `iteration`, `step`).

Rules are chosen in `state.StateBuilder._outer_rules`.
"""

from keras_clones import _keras_internals as internals
from keras_clones.tensor_optimizer import TensorOptimizer


class KerasOuter:
    """The outer optimizer `optimizer` (a Keras optimizer, built on the
    centers) applied to whole variables."""

    state_variables = ()  # Its optimizer's are saved as the outer's.
    state_saved_last = False

    def __init__(self, optimizer):
        self.optimizer = optimizer

    @property
    def variables(self):
        return list(self.optimizer.variables)

    def move(self, fragment, reduced, replicas, applied):
        """The outer optimizer applies `reduced` to the fragment's centers
        (as they are: no further all-reduce), under a conditional where
        `applied` is given (Keras's `apply` assigns as it goes)."""
        centers = fragment.field("center")

        def apply():
            with internals.without_gradient_all_reduce(self.optimizer):
                self.optimizer.apply(reduced, centers)

        if applied is None:
            apply()
        else:
            replicas.run_if(applied, apply)

    def on_worker(self, centers, where):
        return TensorOptimizer(self.optimizer, centers, where)
