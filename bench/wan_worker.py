"""The worker of `bench/wan.py`: one process of its launch, in the network
namespace whose loopback the chief worker shapes.

Imported by `wan.py --worker` once `MultiWorkerMirroredStrategy` exists.
"""

import math
import time

import agn_rounds
import keras
import netns
import wan_report

import keras_clones


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

    def __init__(self, strategy, data, chief, shaped):
        super().__init__(strategy, keras, keras_clones, data, chief)
        self.shaped, self.link = shaped, "unshaped"

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

    def time_steps(self, config, lr, links, plan):
        """One model (seed 0) trained on `links` in turn, `plan["repeats"]`
        times, after warming up for a period on the unshaped link; each
        epoch's wall time and link."""
        rule, period, dtype = config
        model, optimizer = self.build(rule, period, dtype, 0, lr)
        epochs = wan_report.plan_epochs(period, self.steps_per_epoch, plan)
        # Warm up (trace, and set up the round's collective) unshaped.
        schedule = ["unshaped"] * self.warm_up_epochs(period)
        for _ in range(plan["repeats"]):
            for link in links:
                schedule += [link] * epochs
        schedule_callback = LinkSchedule(schedule, self)
        self.fit(model, 0, len(schedule), [schedule_callback])
        self.use_link("unshaped")
        block = wan_report.block_steps(period, self.steps_per_epoch)
        return {
            "config": agn_rounds.config_name(*config),
            "period": period,
            "communication_dtype": dtype,
            "bytes_per_round": optimizer.bytes_per_round,
            "steps_per_epoch": self.steps_per_epoch,
            "block_epochs": block // self.steps_per_epoch,
            "epochs": schedule_callback.epoch_seconds[
                self.warm_up_epochs(period) :
            ],
        }

    def warm_up_epochs(self, period):
        """Epochs that trace the train function and run one round."""
        return math.ceil(period / self.steps_per_epoch)

    def end_to_end(self, config, lr, link, target, epochs):
        """Wall-clock to `target` on `link` (seed 0), evaluation left out.
        The train function is traced first, and one round run, on the
        unshaped link; that training is then undone."""
        rule, period, dtype = config
        model, optimizer = self.build(rule, period, dtype, 0, lr)
        state = {}

        def snapshot(logs=None):  # Once fit has built the optimizer.
            state["model"] = model.get_weights()
            state["optimizer"] = [v.numpy() for v in optimizer.variables]

        warm_up = keras.callbacks.LambdaCallback(on_train_begin=snapshot)
        self.fit(model, 0, self.warm_up_epochs(period), [warm_up])
        model.set_weights(state["model"])
        optimizer.set_weights(state["optimizer"])
        self.use_link(link)
        clock = TimeToTarget(
            self.scorer(model, optimizer), optimizer, target, self
        )
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


def main(strategy, plan, links, quick):
    """Steps to target, time per step per link, end to end; the chief's
    records (None on the other workers)."""
    chief = strategy.cluster_resolver.task_id == 0
    shaped = any(link != "unshaped" for link in links)
    data = agn_rounds.load_data(quick)
    trainer = WanTrainer(strategy, data, chief, shaped)
    lrs = agn_rounds.LEARNING_RATES
    start = time.perf_counter()

    def progress(text):
        if chief:
            print(plan["progress_prefix"] + text, flush=True)

    # 1. Steps to target, on the unshaped link: every seed of every
    # configuration, then the bfloat16 variant of the best.
    configs = [(rule, period, None) for rule, period in plan["configs"]]
    runs = []

    def train(config):
        rule, period, dtype = config
        epochs = plan["sync_epochs" if rule == "sync" else "local_epochs"]
        for seed in plan["seeds"]:
            runs.append(
                trainer.run(rule, period, dtype, seed, epochs, lrs[rule])
            )

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
        timings.append(trainer.time_steps(config, lrs[config[0]], links, plan))
        progress(f"timed {timings[-1]['config']} on {', '.join(links)}")
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
            trainer.end_to_end(
                config, lrs[config[0]], link, steps["target"], epochs
            )
        )
        progress(f"end to end: {name} on {link}")
    if not chief:
        return None
    import tensorflow as tf

    meta = {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "quick": quick,
        "links": links,
        "shaped": shaped,
        "global_batch": agn_rounds.GLOBAL_BATCH,
        "steps_per_epoch": trainer.steps_per_epoch,
        "steps_per_execution": trainer.steps_per_epoch,
        "train_size": len(data[1]),
        "held_out_size": len(data[3]),
        "lr": lrs,
        "plan": {k: v for k, v in plan.items() if k != "progress_prefix"},
        "seconds": time.perf_counter() - start,
    }
    return {
        "meta": meta,
        "runs": runs,
        "timings": timings,
        "end_to_end": end_to_end,
    }
