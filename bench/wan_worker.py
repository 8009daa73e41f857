"""The workers of `bench/wan.py` and `bench/overlap.py`: the processes of a
launch in the network namespace whose loopback the chief worker shapes.

Imported by a worker once its `MultiWorkerMirroredStrategy` exists.
"""

import json
import math
import time

import agn_rounds
import keras
import launching
import netns
import overlap
import tensorflow as tf
import wan_report

import keras_clones

SYNC = agn_rounds.config_name("sync", 1)
LRS = agn_rounds.LEARNING_RATES


class LinkSchedule(keras.callbacks.Callback):
    """Before each epoch, the link `links[epoch]`; records each epoch's
    wall time as `(link, seconds)` in `epoch_seconds`."""

    def __init__(self, links, trainer):
        super().__init__()
        self.links, self.trainer = links, trainer
        self.epoch_seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self.trainer.use_link(self.links[epoch])
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self.start
        self.epoch_seconds.append((self.links[epoch], seconds))


class TimeToTarget(keras.callbacks.Callback):
    """Training's wall-clock with scoring left out; stops `fit` at the
    first epoch whose global model reaches `target` (the chief's decision,
    on every worker)."""

    def __init__(self, score, optimizer, target, trainer):
        super().__init__()
        self.score, self.optimizer = score, optimizer
        self.target, self.trainer = target, trainer
        self.records = []
        self.reached_epoch = self.reached_seconds = None

    def on_train_begin(self, logs=None):
        self.paused = 0.0
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        pause = time.perf_counter()
        seconds = pause - self.start - self.paused
        accuracy = self.score()
        self.records.append(
            {
                "epoch": epoch + 1,
                "steps": int(self.optimizer.local_step.numpy()),
                "accuracy": accuracy,
                "seconds": seconds,
            }
        )
        if self.trainer.agree(int(accuracy >= self.target - 1e-12)):
            self.reached_epoch, self.reached_seconds = epoch + 1, seconds
            self.model.stop_training = True
        self.paused += time.perf_counter() - pause


class WanTrainer(agn_rounds.Trainer):
    """`agn_rounds.Trainer` on links the chief worker shapes."""

    def __init__(self, strategy, data, links):
        chief = strategy.cluster_resolver.task_id == 0
        super().__init__(strategy, keras, keras_clones, data, chief)
        self.shaped = any(link != "unshaped" for link in links)
        self.link, self.start = "unshaped", time.perf_counter()

    def progress(self, text):
        if self.chief:
            print(launching.PROGRESS + text, flush=True)

    def use_link(self, link):
        """Shapes the loopback to `link` between two barriers, so that no
        worker sends a byte of what follows at the old rate."""
        if link == self.link:
            return
        self.agree(0)
        if self.chief and self.shaped:
            netns.shape_own_namespace(netns.LINKS[link])
        self.agree(0)
        self.link = link

    def warm_up_epochs(self, period):
        """Epochs that trace the train function and run one round."""
        return math.ceil(period / self.steps_per_epoch)

    def time_steps(self, config, links, plan):
        """One model (seed 0) trained on `links` in turn, `plan["repeats"]`
        times, after warming up for a period on the unshaped link; each
        epoch's wall time and link."""
        rule, period, dtype = config
        model, optimizer = self.build(rule, period, dtype, 0, LRS[rule])
        epochs = wan_report.plan_epochs(period, self.steps_per_epoch, plan)
        warm_up = self.warm_up_epochs(period)
        per_repeat = [link for link in links for _ in range(epochs)]
        schedule = ["unshaped"] * warm_up + per_repeat * plan["repeats"]
        callback = LinkSchedule(schedule, self)
        self.fit(model, 0, len(schedule), [callback])
        self.use_link("unshaped")
        block = wan_report.block_steps(period, self.steps_per_epoch)
        return {
            "config": agn_rounds.config_name(*config),
            "period": period,
            "communication_dtype": dtype,
            "bytes_per_round": optimizer.bytes_per_round,
            "steps_per_epoch": self.steps_per_epoch,
            "block_epochs": block // self.steps_per_epoch,
            "epochs": callback.epoch_seconds[warm_up:],
        }

    def end_to_end(self, config, link, target, epochs):
        """Wall-clock to `target` on `link` (seed 0), evaluation left out.
        The train function is traced first, and one round run, on the
        unshaped link; that training is then undone."""
        rule, period, dtype = config
        model, optimizer = self.build(rule, period, dtype, 0, LRS[rule])
        state = {}

        def snapshot(logs=None):  # Once fit has built the optimizer.
            state["model"] = model.get_weights()
            state["optimizer"] = [v.numpy() for v in optimizer.variables]

        warm_up = keras.callbacks.LambdaCallback(on_train_begin=snapshot)
        self.fit(model, 0, self.warm_up_epochs(period), [warm_up])
        model.set_weights(state["model"])
        optimizer.set_weights(state["optimizer"])
        self.use_link(link)
        score = self.scorer(model, optimizer)
        clock = TimeToTarget(score, optimizer, target, self)
        self.fit(model, 0, epochs, [clock])
        self.use_link("unshaped")
        return {
            "config": agn_rounds.config_name(*config),
            "link": link,
            "target": target,
            "records": clock.records,
            "reached_epoch": clock.reached_epoch,
            "seconds": clock.reached_seconds,
        }

    def meta(self, links, plan, **more):
        """The records' `meta`, `more` added."""
        return {
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "links": links,
            "shaped": self.shaped,
            "plan": plan,
            "train_size": len(self.y_train),
            "held_out_size": len(self.y_held_out),
            "seconds": time.perf_counter() - self.start,
            **more,
        }


class OverlapTrainer(WanTrainer):
    """A `WanTrainer` whose epochs are a period (`overlap.PERIOD`) and whose
    AGN takes the options of `variant` (`overlap.VARIANTS`)."""

    def __init__(self, strategy, data, links):
        super().__init__(strategy, data, links)
        self.steps_per_epoch = overlap.PERIOD
        self.variant = overlap.WITHOUT

    def optimizer(self, rule, period, dtype, lr):
        config = super().optimizer(rule, period, dtype, lr).get_config()
        options = overlap.VARIANTS[self.variant]
        config.update(overlap=options[0], fragments=options[1])
        return keras_clones.AGNOptimizer.from_config(config)

    def build(self, rule, period, dtype, seed, lr):
        model, optimizer = super().build(rule, period, dtype, seed, lr)
        with self.strategy.scope():  # An execution per fragment.
            model.compile(
                optimizer,
                "sparse_categorical_crossentropy",
                steps_per_execution=overlap.PERIOD // optimizer.fragments,
            )
        return model, optimizer

    def scorer(self, model, optimizer):
        """The centers' held-out accuracy, without applying the commit in
        flight (which would change the run)."""
        predict = tf.function(lambda x: model(x, training=False))
        x_held_out = tf.constant(self.x_held_out)
        variables = model.trainable_variables
        assert len(variables) == len(model.weights)

        def score():
            local = [v.numpy() for v in variables]
            for v in variables:
                v.assign(optimizer.global_center_variable(v))
            predictions = predict(x_held_out).numpy().argmax(axis=-1)
            for v, value in zip(variables, local):
                v.assign(value)
            return float((predictions == self.y_held_out).mean())

        return score

    def build_variant(self, variant, seed):
        self.variant = variant
        lr = LRS["average"]
        return self.build("average", overlap.PERIOD, None, seed, lr)

    def run_variant(self, variant, seed, periods):
        """`variant` trained `periods` periods from `seed`: its records
        and its final accuracy (after `fit`, which applies the commit in
        flight)."""
        model, optimizer = self.build_variant(variant, seed)
        score, records = self.scorer(model, optimizer), []

        def record(epoch, logs):
            records.append(
                {
                    "epoch": epoch + 1,
                    "steps": int(optimizer.local_step.numpy()),
                    "all_reduces": int(optimizer.communication_rounds.numpy()),
                    "accuracy": score(),
                }
            )

        callback = keras.callbacks.LambdaCallback(on_epoch_end=record)
        self.fit(model, seed, periods, [callback])
        return {
            "config": variant,
            "rule": "average",
            "period": overlap.PERIOD,
            "communication_dtype": None,
            "seed": seed,
            "bytes_per_round": optimizer.bytes_per_round,
            "records": records,
            "final": score(),
        }


def print_result(result):
    """Prints the chief's `result` for the driver (None elsewhere)."""
    if result is not None:
        print(launching.RESULT + json.dumps(result), flush=True)


def wan(strategy, plan, links, quick):
    """Steps to target, time per step per link, end to end; the chief's
    records (None on the other workers)."""
    trainer = WanTrainer(strategy, agn_rounds.load_data(quick), links)
    # 1. Steps to target, on the unshaped link: every seed of every
    # configuration, then the bfloat16 variant of the best.
    configs = [(*config, None)[:3] for config in plan["configs"]]
    runs = []

    def train(config):
        rule, period, dtype = config
        epochs = plan["sync_epochs" if rule == "sync" else "local_epochs"]
        for seed in plan["seeds"]:
            runs.append(trainer.run(*config, seed, epochs, LRS[rule]))

    for config in configs:
        train(config)
    if plan["bfloat16"]:
        best = wan_report.best_for_16_bits(wan_report.analyse_steps(runs))
        rule, period, _ = configs[trainer.agree(configs.index(best))]
        configs.append((rule, period, "bfloat16"))
        train(configs[-1])
    steps = wan_report.analyse_steps(runs)
    # 2. Time per step on every link, of the configurations that reach the
    # target (the others have no time to target): the chief's choice.
    timings = []
    chosen = wan_report.configs_to_time(steps, configs)
    mask = trainer.agree(
        sum(1 << i for i, c in enumerate(configs) if c in chosen)
    )
    for config in [c for i, c in enumerate(configs) if mask >> i & 1]:
        timings.append(trainer.time_steps(config, links, plan))
        trainer.progress(f"timed {timings[-1]['config']} on {', '.join(links)}")
    # 3. End to end: synchronous and the AGN configuration that the
    # measured factors say is fastest (the chief's pick).
    link = plan["end_to_end_link"]
    cells = wan_report.time_cells(timings)
    fastest = wan_report.fastest_local(steps, cells, link)
    fastest = configs[trainer.agree(configs.index(fastest))]
    end_to_end = []
    for config in (configs[0], fastest):
        name = agn_rounds.config_name(*config)
        epochs = trainer.agree(steps["curves"][name][-1]["epoch"])
        end_to_end.append(
            trainer.end_to_end(config, link, steps["target"], epochs)
        )
        trainer.progress(f"end to end: {name} on {link}")
    if not trainer.chief:
        return None
    meta = trainer.meta(
        links,
        plan,
        quick=quick,
        global_batch=agn_rounds.GLOBAL_BATCH,
        steps_per_epoch=trainer.steps_per_epoch,
        steps_per_execution=trainer.steps_per_epoch,
        lr=LRS,
    )
    return {
        "meta": meta,
        "runs": runs,
        "timings": timings,
        "end_to_end": end_to_end,
    }


def overlap_runs(strategy, plan, links, quick):
    """`bench/overlap.py`'s steps to target and time per step; the chief's
    records (None on the other workers)."""
    data = agn_rounds.load_data(quick)
    sync = WanTrainer(strategy, data, links)
    trainer = OverlapTrainer(strategy, data, links)

    def progress(text):
        seconds = time.perf_counter() - trainer.start
        trainer.progress(f"{text} ({seconds:.0f} s)")

    runs = []
    for seed in plan["seeds"]:
        epochs = plan["sync_epochs"]
        runs.append(sync.run("sync", 1, None, seed, epochs, LRS["sync"]))
        for variant in overlap.VARIANTS:
            runs.append(trainer.run_variant(variant, seed, plan["periods"]))
            progress(f"{variant} seed {seed}: final {runs[-1]['final']:.4f}")
    # Time per step: one model each, seed 0, interleaved on the links.
    models = {SYNC: (sync, sync.build("sync", 1, None, 0, LRS["sync"])[0])}
    for variant in overlap.VARIANTS:
        models[variant] = (trainer, trainer.build_variant(variant, 0)[0])
    for owner, model in models.values():  # Trace; a round; unshaped.
        owner.fit(model, 0, 2 * overlap.PERIOD // owner.steps_per_epoch, [])
    # Each in a fit of its own on each link: seconds per step of each epoch
    # (a period; synchronous training, an execution), the first (nothing in
    # flight) left out.
    units = {}
    for _ in range(plan["repeats"]):
        for link in links:
            trainer.use_link(link)
            for name, (owner, model) in models.items():
                epochs = plan["sync_epochs_per_block"]
                if owner is trainer:
                    epochs = plan["periods_per_block"]
                schedule = LinkSchedule([link] * epochs, trainer)
                owner.fit(model, 0, epochs, [schedule])
                units.setdefault(f"{name}|{link}", []).extend(
                    seconds / owner.steps_per_epoch
                    for _, seconds in schedule.epoch_seconds[1:]
                )
            progress(f"timed on {link}")
    trainer.use_link("unshaped")
    if not trainer.chief:
        return None
    meta = trainer.meta(
        links, plan, sync_steps_per_execution=sync.steps_per_epoch
    )
    return {"meta": meta, "runs": runs, "seconds_per_step": units}
