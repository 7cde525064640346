"""Benchmark recurrent policies: LSTM-PPO against SB3-contrib's RecurrentPPO, LSTM sampling speed, and
R2D2 against RLlib's tuned example.

1. Time to solve ``StatelessCartPole-v1`` (CartPole without its velocities: flowrl's built-in env,
   used by both libraries), side by side:

   - flowrl's LSTM-PPO with ``tuned_examples/stateless-cartpole-lstm-ppo.yaml`` (``--config``
     picks another file), exactly what ``flowrl train --config FILE --seed S`` builds, trained until
     ``episode_reward_mean`` (the mean of the last 100 finished episodes) reaches 150, checked after
     every ``train()`` call;
   - when sb3-contrib is importable (the ``bench`` extra): its ``RecurrentPPO`` with
     rl-baselines3-zoo's ``CartPoleNoVel-v1`` hyperparameters (:data:`SB3_ZOO_PPO_LSTM`, the zoo's
     ``hyperparams/ppo_lstm.yml``; ``MlpLstmPolicy`` with its defaults), until the mean of the last 100
     finished episodes (the Monitor episodes in ``ep_info_buffer``) reaches 150, checked after every
     rollout. The zoo's linear schedules keep the zoo's horizon whatever the step cap.

   Both run with ``torch.set_num_threads(1)`` (flowrl's ``learner_threads`` default; set explicitly
   for SB3) on the CPU. Each trial runs in a fresh Python process whose clock starts before importing
   ray or torch, so imports, start-up and training all count; seeds 0, 1, 2, the libraries alternating
   (flowrl, SB3, then the next seed); a trial stops at ``--max-steps`` env steps (default 200k) and
   counts as failed (an infinite time in the medians). The ratio is median flowrl wall / median SB3
   wall (goal: <= 1.0).

2. Sampling speed of one :class:`flowrl.actors.RolloutWorker` in this process (in-driver sampling, as
   the tuned example's ``num_workers: 0``): 16 envs of ``StatelessCartPole-v1``, fragments of 32,
   PPO's policy and GAE postprocessing, one PyTorch thread. The LSTM policy (the tuned example's
   model) against an MLP policy (``fcnet_hiddens: [64, 64]``, what PPO without memory uses in
   tests/algorithms/test_recurrent_learning.py), and the LSTM policy forced onto its PyTorch acting
   path (``policy._numpy_model = None``: how it acted before its NumPy twin); repetitions alternate
   after a warm-up; env steps/s medians and LSTM / MLP (goal: >= 0.5).

3. R2D2's time to 150 on ``StatelessCartPole-v1`` (SB3 and SB3-contrib have no R2D2, and RLlib dropped
   it from Ray 2.x, so RLlib's published tuned example is the peer's figure), as part 1 measures it (fresh
   processes, seeds 0, 1, 2, the settings alternating), each trial capped at ``--r2d2-max-steps`` (default
   RLlib's own budget of 1M steps; a capped trial fails, with its best 100-episode mean):

   - flowrl's ``tuned_examples/stateless-cartpole-r2d2.yaml``;
   - RLlib's ``rllib/tuned_examples/r2d2/stateless-cartpole-r2d2.yaml`` (:data:`RLLIB_R2D2_EXAMPLE`), read
     by flowrl's RLlib key translation as ``flowrl train --config`` reads a ported file (its translation
     notes go into the JSON);
   - the same with ``replay_burn_in: 0``: flowrl's burn-in is the first steps of each replayed sequence
     (but in a sequence that starts its episode), RLlib's came before it, so with RLlib's burn-in of 20 the
     first 20 steps of a fragment that continues an episode are not learned (each trial records the median
     steps learned per replayed batch);
   - RLlib's published figure: 150 within its example's 1,000,000 steps; and part 1's medians from the
     results file, for context.

Run from the repository root::

    python benchmarks/recurrent.py                 # full run: 15 trials and the sampling part, ~30 minutes
    python benchmarks/recurrent.py --quick         # seed 0, 150k (R2D2 100k) caps, fewer sampling reps
    python benchmarks/recurrent.py --only sampling # the sampling part alone (~1 minute)
    python benchmarks/recurrent.py --only r2d2     # part 3 alone (~10 minutes); keeps the file's other parts
    python benchmarks/recurrent.py --trial sb3 --seed 1   # one trial; prints a JSON line

It prints tables and writes the figures as JSON to ``--out`` (default
``benchmarks/results/recurrent.json``), with the 1-minute load average around each part: on a shared
2-core machine other load moves every figure.

Measured by a full run (2-core AMD EPYC shared with other jobs, 1-minute load average 5 to 11; torch
2.13 CPU, sb3-contrib 2.9.2):

- time to 150: flowrl median 28.1 s (seeds 0, 1, 2: 28.1, 27.9, 32.6 s at 66,048, 133,120, 100,352
  steps), RecurrentPPO median 271.3 s (253.9, 428.7, 271.3 s at 35,584, 59,648, 30,208 steps):
  flowrl / SB3 = 0.104 (goal <= 1.0: met);
- sampling: MLP 38,511, LSTM 26,524, LSTM on the PyTorch acting path 9,427 env steps/s: LSTM / MLP
  0.689 (0.562 per CPU second; goal >= 0.5: met), 0.245 on the PyTorch path (what it was before the
  NumPy twin), NumPy / PyTorch acting 2.81x.

Part 3, by ``--only r2d2`` (the same machine, 1-minute load 0.7 to 1.0), after R2D2 learned a sequence
that starts its episode from its first step (before that, RLlib's settings stayed at a best mean of 23:
every early episode was inside the burn-in):

- flowrl's R2D2 tuned example: 3/3, median 7.8 s (9.1, 7.8, 7.4 s; 29,440 steps each), a median of
  217-239 of each replayed batch's 320 steps learned;
- RLlib's example settings, translated: 3/3 within RLlib's 1,000,000 steps, median 56.5 s and 192,400
  steps (seed 0: 88.5 s, 314,080 steps; seed 1: 56.5 s, 192,400; seed 2: 55.4 s, 189,280), 81-83 steps
  learned per batch;
- RLlib's settings with ``replay_burn_in: 0``: 3/3, median 41.8 s (39.3, 41.8, 78.2 s at 138,320,
  152,880, 276,640 steps);
- RLlib published 150 within 1,000,000 steps (no time).
"""

from __future__ import annotations

import time

_CLOCK_START = time.perf_counter()  # a --trial's clock: before importing ray, torch or flowrl

# Imported after the clock started, which counts them too.
import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from time_to_solve import (  # noqa: E402  # benchmarks/ is on the path
    ZooLinearSchedule,
    emit,
    finite,
    loadavg,
    machine_info,
    package_version,
    run_child,
    stop_at_reward,
    write_report,
)

ENV_ID = "StatelessCartPole-v1"
TARGET_REWARD = 150.0
MAX_STEPS = 200_000
SEEDS = (0, 1, 2)
RATIO_GOAL = 1.0
SAMPLING_GOAL = 0.5
TRIAL_TIMEOUT_S = 1800
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "recurrent.json"
TUNED_EXAMPLE = "tuned_examples/stateless-cartpole-lstm-ppo.yaml"
NUM_ENVS = 16
FRAGMENT_LENGTH = 32
MLP_MODEL = {"fcnet_hiddens": [64, 64]}
R2D2_TUNED_EXAMPLE = "tuned_examples/stateless-cartpole-r2d2.yaml"
R2D2_MAX_STEPS = 1_000_000  # RLlib's own budget
RLLIB_R2D2_BUDGET = 1_000_000  # the timesteps_total stop of RLlib's example: it reached 150 within it

# RLlib's tuned example rllib/tuned_examples/r2d2/stateless-cartpole-r2d2.yaml (Ray 2.x, before R2D2 was
# removed), in RLlib's layout with its keys and values; the env is flowrl's StatelessCartPole-v1 (RLlib
# named its own copy, ray.rllib.examples.env.stateless_cartpole.StatelessCartPole). No seed: each trial
# passes one, as `flowrl train --config FILE --seed S` would.
RLLIB_R2D2_EXAMPLE: dict[str, Any] = {
    "stateless-cartpole-r2d2": {
        "env": ENV_ID,
        "run": "R2D2",
        "stop": {"episode_reward_mean": TARGET_REWARD, "timesteps_total": RLLIB_R2D2_BUDGET},
        "config": {
            "framework": "torch",
            "num_workers": 0,
            "replay_buffer_config": {
                "type": "MultiAgentReplayBuffer",
                "storage_unit": "sequences",
                "replay_burn_in": 20,
                "zero_init_states": True,
            },
            "lr": 0.0005,
            "exploration_config": {"epsilon_timesteps": 50000},
            "model": {
                "fcnet_hiddens": [64],
                "fcnet_activation": "linear",
                "use_lstm": True,
                "lstm_cell_size": 64,
                "max_seq_len": 20,
            },
        },
    }
}

# Part 3's trials: what each runs and its name in the table.
R2D2_KINDS = {
    "r2d2": f"flowrl R2D2 ({Path(R2D2_TUNED_EXAMPLE).name})",
    "r2d2-rllib": "RLlib's example settings, run by flowrl",
    "r2d2-rllib-no-burn-in": "RLlib's settings with replay_burn_in 0",
}

# rl-baselines3-zoo's CartPoleNoVel-v1 entry of hyperparams/ppo_lstm.yml (RecurrentPPO, MlpLstmPolicy).
SB3_ZOO_PPO_LSTM: dict[str, Any] = {
    "n_envs": 8,
    "n_timesteps": 100_000,
    "policy": "MlpLstmPolicy",
    "n_steps": 32,
    "batch_size": 256,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "n_epochs": 20,
    "ent_coef": 0.0,
    "learning_rate": "lin_1e-3",
    "clip_range": "lin_0.2",
}


def sb3_contrib_available() -> bool:
    """Whether sb3-contrib is installed (checked without importing it)."""
    return package_version("sb3-contrib") is not None


def progress(kind: str, seed: int, steps: int, reward: float | None, now: float) -> None:
    """One progress line on stderr."""
    shown = reward if reward is not None else float("nan")
    print(f"  [{kind} seed {seed}] steps {steps:>7}  reward {shown:7.1f}  t {now:6.1f}s", file=sys.stderr, flush=True)


# -- 1. one trial (in its own process) ------------------------------------------------------


def flowrl_trial(kind: str, seed: int, target: float, max_steps: int, config_file: str) -> dict[str, Any]:
    """Train flowrl's LSTM-PPO with ``config_file`` (kind ``flowrl``) or R2D2 (the ``R2D2_KINDS``) until the
    100-episode mean reaches ``target`` or ``max_steps``."""
    load_start = loadavg()
    from flowrl.algorithms import get_algorithm
    from flowrl.cli.args import build_config
    from flowrl.config.rllib import RLlibConfigNote
    from flowrl.engine.trainer import Trainer
    from flowrl.runs.experiment import load_experiment_file, parse_experiment

    if kind == "flowrl":
        experiment = load_experiment_file(config_file)
    elif kind == "r2d2":
        experiment = load_experiment_file(str(ROOT / R2D2_TUNED_EXAMPLE))
    else:  # RLlib's example as a user porting it would run it: its keys read by flowrl's RLlib translation
        experiment = parse_experiment(RLLIB_R2D2_EXAMPLE)
        if kind == "r2d2-rllib-no-burn-in":
            experiment["config"]["replay_buffer_config"] = {
                **experiment["config"]["replay_buffer_config"],
                "replay_burn_in": 0,
            }
    # What `flowrl train --config FILE --seed S` builds; an RLlib config's translation notes are kept.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RLlibConfigNote)
        config = build_config(
            get_algorithm(experiment["algo"]),
            experiment["config"],
            argparse.Namespace(set=[], num_workers=None, seed=seed),
        )
    notes = [str(w.message) for w in caught if w.category is RLlibConfigNote]
    t_imported = time.perf_counter()
    trainer = Trainer(experiment["algo"], ENV_ID, config)
    batch_size = trainer.config.train_batch_size
    t_ready = time.perf_counter()
    history: list[list[Any]] = []
    learned: list[float] = []  # R2D2: steps learned per replayed batch (the others are burn-in or padding)
    result: dict[str, Any] = {}
    reached, steps = False, 0
    try:
        while not reached and steps < max_steps:
            result = trainer.train()
            steps = int(result.get("timesteps_total", 0))
            reward = finite(result.get("episode_reward_mean"))
            now = time.perf_counter() - _CLOCK_START
            history.append([steps, reward, round(now, 3)])
            stats = result.get("info", {}).get("learner", {}).get("default_policy", {})
            if finite(stats.get("learned_steps")) is not None:
                learned.append(stats["learned_steps"])
            if len(history) % 10 == 1:
                progress(kind, seed, steps, reward, now)
            reached = reward is not None and reward >= target
        t_done = time.perf_counter()
        import torch  # already loaded by the Trainer: its thread count, not an import cost

        torch_threads = torch.get_num_threads()
    finally:
        trainer.stop()
    rewards = [h[1] for h in history if h[1] is not None]
    return {
        "kind": kind,
        "seed": seed,
        "reached": reached,
        "wall_s": t_done - _CLOCK_START,
        "env_steps": steps,
        "final_reward_mean": finite(result.get("episode_reward_mean")),
        "best_reward_mean": max(rewards, default=None),
        "train_batch_size": batch_size,
        "learned_steps_per_batch_median": statistics.median(learned) if learned else None,
        "rllib_notes": notes,
        "phases_s": {
            "imports": t_imported - _CLOCK_START,
            "trainer_start": t_ready - t_imported,
            "training": t_done - t_ready,
        },
        "torch_threads": torch_threads,
        "timers": result.get("timers", {}),
        "history": history,
        "loadavg_start_end": [load_start, loadavg()],
    }


def sb3_trial(seed: int, target: float, max_steps: int) -> dict[str, Any]:
    """Train SB3-contrib's RecurrentPPO (rl-zoo CartPoleNoVel-v1 settings) until the 100-episode mean
    reaches ``target`` or ``max_steps``."""
    load_start = loadavg()
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env

    import flowrl.envs.memory  # noqa: F401  # registers StatelessCartPole-v1 with Gymnasium

    torch.set_num_threads(1)  # as flowrl's learner_threads default

    def every_40th(history: list[list[Any]]) -> None:
        if len(history) % 40 == 1:
            progress("sb3", seed, *history[-1])

    zoo = SB3_ZOO_PPO_LSTM
    t_imported = time.perf_counter()
    env = make_vec_env(ENV_ID, n_envs=zoo["n_envs"], seed=seed)  # DummyVecEnv, each env in a Monitor
    model = RecurrentPPO(
        zoo["policy"],
        env,
        n_steps=zoo["n_steps"],
        batch_size=zoo["batch_size"],
        gae_lambda=zoo["gae_lambda"],
        gamma=zoo["gamma"],
        n_epochs=zoo["n_epochs"],
        ent_coef=zoo["ent_coef"],
        learning_rate=ZooLinearSchedule(1e-3, 0.0, 1.0, zoo["n_timesteps"], max_steps),
        clip_range=ZooLinearSchedule(0.2, 0.0, 1.0, zoo["n_timesteps"], max_steps),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    t_ready = time.perf_counter()
    callback = stop_at_reward(target, _CLOCK_START, every_40th)
    model.learn(total_timesteps=max_steps, callback=callback)
    t_done = time.perf_counter()
    env.close()
    reached = callback.reached_at is not None
    history = callback.history
    return {
        "kind": "sb3",
        "seed": seed,
        "reached": reached,
        "wall_s": t_done - _CLOCK_START,
        "env_steps": callback.reached_at[1] if reached else int(model.num_timesteps),
        "final_reward_mean": history[-1][1] if history else None,
        "phases_s": {"imports": t_imported - _CLOCK_START, "setup": t_ready - t_imported, "training": t_done - t_ready},
        "torch_threads": torch.get_num_threads(),
        "history": history[:: max(1, len(history) // 100)] + history[-1:],
        "loadavg_start_end": [load_start, loadavg()],
    }


def run_trial(
    kind: str, seed: int, target: float, max_steps: int, config_file: str, timeout_s: float
) -> dict[str, Any]:
    """One trial in a fresh Python process: its JSON result, or a failure record."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trial", kind, "--seed", str(seed)]
    cmd += ["--target", str(target), "--max-steps", str(max_steps), "--config", config_file]
    print(f"\n-- {kind} seed {seed} (load {loadavg()[0]:.2f})", flush=True)
    result = run_child(cmd, {"kind": kind, "seed": seed, "reached": False}, timeout_s)
    if "error" not in result:
        status = "reached" if result["reached"] else "NOT reached"
        print(f"   {status} {target:g} at {result['env_steps']} steps, {result['wall_s']:.1f} s", flush=True)
    return result


def summarize(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians (a failed trial counting as infinite) and the per-seed figures of one library's trials."""

    def median(key: str) -> float | None:
        value = statistics.median([t[key] if t.get("reached") else math.inf for t in trials])
        return value if math.isfinite(value) else None

    keys = ("seed", "reached", "wall_s", "env_steps", "final_reward_mean", "best_reward_mean", "error")
    keys += ("learned_steps_per_batch_median",)
    return {
        "trials": len(trials),
        "reached": sum(bool(t.get("reached")) for t in trials),
        "median_wall_s": median("wall_s"),
        "median_env_steps": median("env_steps"),
        "per_seed": [{k: t[k] for k in keys if k in t} for t in trials],
    }


# -- 2. sampling speed (in this process) ------------------------------------------------------


def sampling_worker(model: dict[str, Any]) -> Any:
    """A rollout worker in this process with PPO's policy on ``model``, 16 envs, fragments of 32."""
    from flowrl.actors import RolloutWorker
    from flowrl.algorithms import get_algorithm
    from flowrl.engine.build import policy_specs
    from flowrl.envs import get_env_creator

    ppo = get_algorithm("ppo")
    settings = {"num_envs_per_worker": NUM_ENVS, "rollout_fragment_length": FRAGMENT_LENGTH}
    config = ppo.config_class.from_dict({"seed": 0, "num_workers": 0, **settings, "model": model}).frozen()
    creator = get_env_creator(ENV_ID)
    return RolloutWorker(env_creator=creator, policy_specs=policy_specs(ppo, config, creator), config=config)


def run_sampling(reps: int, rep_seconds: float) -> dict[str, Any]:
    """Env steps per wall second of the MLP, LSTM and LSTM-on-PyTorch workers, repetitions alternating."""
    import torch

    from flowrl.runs.experiment import load_experiment_file

    torch.set_num_threads(1)
    lstm_model = load_experiment_file(str(ROOT / TUNED_EXAMPLE))["config"]["model"]
    workers = {"mlp": sampling_worker(MLP_MODEL), "lstm": sampling_worker(lstm_model)}
    workers["lstm_torch_path"] = sampling_worker(lstm_model)
    workers["lstm_torch_path"].get_policy()._numpy_model = None
    calls: dict[str, int] = {}
    for name, worker in workers.items():  # warm up, then size each repetition to ~rep_seconds
        worker.sample()
        start = time.perf_counter()
        for _ in range(3):
            worker.sample()
        calls[name] = max(1, round(rep_seconds / ((time.perf_counter() - start) / 3)))
    rates: dict[str, list[float]] = {name: [] for name in workers}
    cpu_rates: dict[str, list[float]] = {name: [] for name in workers}
    for _ in range(reps):
        for name, worker in workers.items():
            steps, start, cpu0 = 0, time.perf_counter(), time.thread_time()
            for _ in range(calls[name]):
                steps += worker.sample().count
            rates[name].append(steps / (time.perf_counter() - start))
            cpu_rates[name].append(steps / (time.thread_time() - cpu0))
    acting = {name: "numpy" if w.get_policy()._numpy_twin() is not None else "torch" for name, w in workers.items()}
    for worker in workers.values():
        worker.stop()
    med = {name: statistics.median(v) for name, v in rates.items()}
    med_cpu = {name: statistics.median(v) for name, v in cpu_rates.items()}
    ratio = med["lstm"] / med["mlp"]
    return {
        "setup": f"{ENV_ID}, {NUM_ENVS} envs, fragments of {FRAGMENT_LENGTH}, one RolloutWorker in this process, "
        f"PPO's policy and GAE, torch threads 1; LSTM: {lstm_model}; MLP: {MLP_MODEL}",
        "acting_path": acting,
        "steps_per_s": med,
        "steps_per_cpu_s": med_cpu,
        "lstm_over_mlp": ratio,
        "lstm_over_mlp_per_cpu_s": med_cpu["lstm"] / med_cpu["mlp"],
        "lstm_torch_path_over_mlp": med["lstm_torch_path"] / med["mlp"],
        "numpy_over_torch_acting": med["lstm"] / med["lstm_torch_path"],
        "reps_steps_per_s": rates,
        "goal": f"lstm_over_mlp >= {SAMPLING_GOAL}",
        "met": ratio >= SAMPLING_GOAL,
    }


# -- 3. R2D2 against RLlib's tuned example -----------------------------------------------------


def run_r2d2(
    seeds: list[int], target: float, max_steps: int, timeout_s: float, earlier: dict[str, Any]
) -> dict[str, Any]:
    """R2D2's trials (the ``R2D2_KINDS`` alternating, then the next seed), RLlib's published budget, and
    part 1's medians from this run or ``earlier`` (the results file's) for context."""
    load_start = loadavg()[0]
    trials: dict[str, list[dict[str, Any]]] = {kind: [] for kind in R2D2_KINDS}
    for seed in seeds:
        for kind in R2D2_KINDS:
            trials[kind].append(run_trial(kind, seed, target, max_steps, TUNED_EXAMPLE, timeout_s))
    context = {
        name: {key: summary[key] for key in ("median_wall_s", "median_env_steps", "reached", "trials")}
        for name, summary in earlier.get("time_to_solve", {}).get("results", {}).items()
    }
    return {
        "target": target,
        "max_steps": max_steps,
        "capped_below_rllib_budget": max_steps < RLLIB_R2D2_BUDGET,
        "seeds": seeds,
        "rllib_example": RLLIB_R2D2_EXAMPLE,
        "rllib_published": {
            "source": "rllib/tuned_examples/r2d2/stateless-cartpole-r2d2.yaml (Ray 2.x)",
            "stop": f"episode_reward_mean {TARGET_REWARD:g} within timesteps_total {RLLIB_R2D2_BUDGET}",
            "env_steps_budget": RLLIB_R2D2_BUDGET,
        },
        "results": {R2D2_KINDS[kind]: summarize(ts) for kind, ts in trials.items()},
        "part1_context": context,
        "loadavg_start_end": [load_start, loadavg()[0]],
        "trials": trials,
    }


def print_r2d2(r2d2: dict[str, Any]) -> None:
    """Part 3's table."""
    cap = r2d2["max_steps"]
    capped = (
        f"; RLlib's own budget is {RLLIB_R2D2_BUDGET:,}, capped here for time"
        if r2d2["capped_below_rllib_budget"]
        else ""
    )
    print(
        f"\n3. R2D2: time to a 100-episode mean of {r2d2['target']:g} on {ENV_ID} (cap {cap:,} steps{capped}), "
        f"seeds {r2d2['seeds']}; a capped trial fails (infinite in the medians) with its best mean"
    )
    print(f"{'setting':<52}{'reached':>8}{'median wall s':>15}{'median steps':>14}")
    for name, summary in r2d2["results"].items():
        wall = "n/a" if summary["median_wall_s"] is None else f"{summary['median_wall_s']:.1f}"
        steps = "n/a" if summary["median_env_steps"] is None else f"{summary['median_env_steps']:.0f}"
        print(f"{name:<52}{summary['reached']:>5}/{summary['trials']:<2}{wall:>15}{steps:>14}")
        for p in summary["per_seed"]:
            wall_p = f"{p['wall_s']:.1f} s" if p.get("wall_s") is not None else "-"
            best = p.get("best_reward_mean")
            learned = p.get("learned_steps_per_batch_median")
            print(
                f"    seed {p['seed']}: {'reached' if p['reached'] else 'NOT reached':<12}{wall_p:>9}  "
                f"{p.get('env_steps') or 0:>7} steps  best mean {'-' if best is None else f'{best:.1f}'}"
                + ("" if learned is None else f"  learned steps per replayed batch {learned:.0f}")
                + (f"  ({p['error']})" if "error" in p else "")
            )
    published = "RLlib's R2D2 (published: its stop budget to 150)"
    print(f"{published:<52}{'':>8}{'n/a':>15}{f'<= {RLLIB_R2D2_BUDGET}':>14}")
    if not r2d2["part1_context"]:
        print("part 1: no time-to-solve figures in the results file (python benchmarks/recurrent.py --only solve)")
    for name, c in r2d2["part1_context"].items():
        wall = "n/a" if c["median_wall_s"] is None else f"{c['median_wall_s']:.1f}"
        steps = "n/a" if c["median_env_steps"] is None else f"{c['median_env_steps']:.0f}"
        print(f"{'part 1: ' + name:<52}{c['reached']:>5}/{c['trials']:<2}{wall:>15}{steps:>14}")


# -- report ------------------------------------------------------------------------------------


def print_report(report: dict[str, Any]) -> None:
    """The figures of ``report`` as tables."""
    machine = report["machine"]
    print(
        f"\nmachine: {machine['cpu_count']} CPUs ({machine.get('cpu_model', '?')}), torch {machine['torch']}, "
        f"sb3-contrib {machine.get('sb3-contrib') or 'not installed'}; 1-min load: "
        + ", ".join(f"{k} {v:.2f}" for k, v in machine["loadavg"].items())
    )
    if "time_to_solve" in report:
        solve = report["time_to_solve"]
        print(
            f"\n1. Time to a 100-episode mean of {solve['target']:g} on {ENV_ID} (cap {solve['max_steps']} steps), "
            f"seeds {solve['seeds']}; failed trials count as infinite"
        )
        print(f"{'library':<52}{'reached':>8}{'median wall s':>15}{'median steps':>14}")
        for name, summary in solve["results"].items():
            wall = "n/a" if summary["median_wall_s"] is None else f"{summary['median_wall_s']:.1f}"
            steps = "n/a" if summary["median_env_steps"] is None else f"{summary['median_env_steps']:.0f}"
            print(f"{name:<52}{summary['reached']:>5}/{summary['trials']:<2}{wall:>15}{steps:>14}")
            for p in summary["per_seed"]:
                wall_p = f"{p['wall_s']:.1f} s" if p.get("wall_s") is not None else "-"
                print(
                    f"    seed {p['seed']}: {'reached' if p['reached'] else 'NOT reached':<12}{wall_p:>9}  "
                    f"{p.get('env_steps') or 0:>7} steps" + (f"  ({p['error']})" if "error" in p else "")
                )
        r = solve["ratio"]
        if r is not None:
            if r["flowrl_wall_over_sb3_wall"] is not None:
                value = f"{r['flowrl_wall_over_sb3_wall']:.3f}"
            elif "flowrl_wall_over_sb3_wall_at_most" in r:
                value = f"at most {r['flowrl_wall_over_sb3_wall_at_most']:.3f} (SB3 missed the target in most trials)"
            else:
                value = "n/a"
            print(f"flowrl wall / SB3 wall = {value} (goal {r['goal']}): {'met' if r['met'] else 'NOT met'}")
    if "sampling" in report:
        s = report["sampling"]
        print(f"\n2. Sampling ({s['setup']}); median env steps/s (per CPU s of this thread)")
        for name, rate in s["steps_per_s"].items():
            print(f"  {name:<18}{rate:>10.0f} ({s['steps_per_cpu_s'][name]:.0f})  acting in {s['acting_path'][name]}")
        print(
            f"  LSTM / MLP {s['lstm_over_mlp']:.3f} ({s['lstm_over_mlp_per_cpu_s']:.3f} per CPU s; goal {s['goal']}):"
            f" {'met' if s['met'] else 'NOT met'}; on the PyTorch acting path {s['lstm_torch_path_over_mlp']:.3f};"
            f" NumPy / PyTorch acting {s['numpy_over_torch_acting']:.2f}x"
        )
    if "r2d2" in report:
        print_r2d2(report["r2d2"])


def main() -> None:
    """Parse options; run one trial (``--trial``) or the benchmark's parts."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON figures")
    parser.add_argument("--quick", action="store_true", help="seed 0 only, a 150k cap, fewer sampling reps")
    parser.add_argument("--only", choices=("solve", "sampling", "r2d2"), help="run one part only")
    parser.add_argument("--config", default=TUNED_EXAMPLE, help=f"flowrl's experiment file (default {TUNED_EXAMPLE})")
    parser.add_argument("--seeds", type=int, nargs="+", help=f"seeds (default {' '.join(map(str, SEEDS))})")
    parser.add_argument("--target", type=float, default=TARGET_REWARD, help="100-episode mean reward to reach")
    parser.add_argument("--max-steps", type=int, help=f"env steps after which a trial fails (default {MAX_STEPS})")
    parser.add_argument("--no-sb3", action="store_true", help="skip SB3-contrib even if it is installed")
    parser.add_argument("--reps", type=int, help="sampling repetitions per policy (default 5, quick 3)")
    parser.add_argument("--trial-timeout", type=float, default=TRIAL_TIMEOUT_S, help="seconds before a trial is killed")
    parser.add_argument(
        "--trial", choices=("flowrl", "sb3", *R2D2_KINDS), help="run one trial in this process; print a JSON line"
    )
    parser.add_argument(
        "--r2d2-max-steps", type=int, help=f"env steps after which an R2D2 trial fails (default {R2D2_MAX_STEPS})"
    )
    parser.add_argument("--seed", type=int, default=0, help="the seed of a --trial")
    args = parser.parse_args()
    max_steps = args.max_steps or (150_000 if args.quick else MAX_STEPS)
    if args.trial == "flowrl" or args.trial in R2D2_KINDS:
        emit(flowrl_trial(args.trial, args.seed, args.target, max_steps, args.config))
        return
    if args.trial == "sb3":
        emit(sb3_trial(args.seed, args.target, max_steps))
        return

    machine = machine_info()
    machine["sb3-contrib"] = package_version("sb3-contrib")
    loads: dict[str, float] = {}
    report: dict[str, Any] = {"machine": machine}
    started = time.perf_counter()
    if args.only in (None, "solve"):
        loads["solve_start"] = loadavg()[0]
        seeds = args.seeds or ([0] if args.quick else list(SEEDS))
        with_sb3 = sb3_contrib_available() and not args.no_sb3
        kinds = ["flowrl", "sb3"] if with_sb3 else ["flowrl"]
        trials: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
        for seed in seeds:  # alternating: each library for one seed, then the next seed
            for kind in kinds:
                trials[kind].append(run_trial(kind, seed, args.target, max_steps, args.config, args.trial_timeout))
        names = {"flowrl": f"flowrl LSTM-PPO ({Path(args.config).name})", "sb3": "SB3-contrib RecurrentPPO (zoo)"}
        results = {names[kind]: summarize(ts) for kind, ts in trials.items()}
        ratio = None
        if with_sb3:
            a, b = (results[names[kind]]["median_wall_s"] for kind in ("flowrl", "sb3"))
            value = a / b if a is not None and b is not None else None
            ratio = {
                "flowrl_wall_over_sb3_wall": value,
                "goal": f"<= {RATIO_GOAL}",
                "met": value is not None and value <= RATIO_GOAL,
            }
            sb3_walls = [p.get("wall_s") for p in results[names["sb3"]]["per_seed"]]
            if a is not None and b is None and None not in sb3_walls:
                # A trial that missed the target would have taken at least the time it ran: the median of
                # all SB3 walls bounds SB3's median from below, so the ratio from above.
                bound = a / statistics.median(sb3_walls)
                ratio.update(flowrl_wall_over_sb3_wall_at_most=bound, met=bound <= RATIO_GOAL)
        report["time_to_solve"] = {
            "target": args.target,
            "max_steps": max_steps,
            "seeds": seeds,
            "flowrl_config_file": args.config,
            "sb3_hyperparameters": SB3_ZOO_PPO_LSTM if with_sb3 else "skipped (--no-sb3 or sb3-contrib not installed)",
            "wall_s": "from process start (before importing ray/torch) to the train()/learn() call reaching the target",
            "results": results,
            "ratio": ratio,
            "trials": trials,
        }
    if args.only in (None, "sampling"):
        loads["sampling_start"] = loadavg()[0]
        report["sampling"] = run_sampling(args.reps or (3 if args.quick else 5), 0.5 if args.quick else 1.5)
    # A part run alone replaces its own figures in the results file and keeps the others'.
    earlier = json.loads(args.out.read_text()) if args.only and args.out.exists() else {}
    if args.only in (None, "r2d2"):
        loads["r2d2_start"] = loadavg()[0]
        seeds = args.seeds or ([0] if args.quick else list(SEEDS))
        r2d2_cap = args.r2d2_max_steps or (100_000 if args.quick else R2D2_MAX_STEPS)
        report["r2d2"] = run_r2d2(seeds, args.target, r2d2_cap, args.trial_timeout, {**earlier, **report})
    loads["end"] = loadavg()[0]
    machine["loadavg"] = loads
    report["total_s"] = time.perf_counter() - started
    print_report(report)
    report = {**earlier, **report}
    write_report(args.out, report)


if __name__ == "__main__":
    main()
