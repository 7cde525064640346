"""Benchmark MuJoCo: flowrl's TD3 or SAC against Stable-Baselines3's on a MuJoCo env (default Hopper-v5).

flowrl trains with the env's tuned example (``tuned_examples/hopper-td3.yaml``, ``...-sac.yaml``;
what ``flowrl train --config FILE --seed S`` builds), and SB3 with the same settings read from that
file: the same network sizes (actor and critics), batch size, learning rates, replay size,
``learning_starts``, ``tau``, ``gamma``, twin critics and one gradient update per env step (SB3:
``train_freq=1, gradient_steps=1``; flowrl: ``training_intensity`` equal to the batch size), on CPU
with the same number of PyTorch threads. TD3 explores with the file's Gaussian noise on both sides;
SAC tunes its entropy coefficient from ``initial_alpha`` towards ``target_entropy: auto`` (-|A|) on both.

Per trial, at the step budget (``--steps``, default 50k env steps):

- the mean return of the last 20 episodes (flowrl: ``episode_reward_mean`` with
  ``metrics_smoothing_episodes: 20``; SB3: its Monitor's last 20 episodes);
- env steps per second in the steady training phase, after ``learning_starts`` (flowrl: from the end
  of the first ``train()`` call past it to the last; SB3: from the first env step past it to the end
  of ``learn()``), and per CPU second of the trial's process over the same window;
- the 1-minute load average at its start and end (other load on a shared machine slows every trial).

Each trial runs in a fresh Python process (``--trial flowrl|sb3``); the trials alternate (flowrl,
then SB3, for each seed of ``--seeds``). The summary gives each side's mean and standard deviation
of the final returns over the seeds and its median steps/s; the issue's goal for SAC on Hopper-v5 is
flowrl's mean >= SB3's mean - one SB3 standard deviation, at >= 1.0x SB3's steps/s.

Run from the repository root (``pip install -e '.[mujoco,bench]'``)::

    python benchmarks/mujoco.py --algo td3 --seeds 0 1 2 --steps 50000   # about 15 minutes a trial on 2 cores
    python benchmarks/mujoco.py --algo td3 --seeds 0 --steps 5000 --learning-starts 1000   # end to end, short
    python benchmarks/mujoco.py --trial flowrl --algo td3 --seed 0 --steps 5000   # one trial; prints a JSON line

It prints a table and writes the figures as JSON to ``--out`` (default ``benchmarks/results/mujoco.json``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# This script's name is the mujoco package's: with its folder first on sys.path, as Python puts it,
# Gymnasium's `import mujoco` would import this file. Its folder goes last instead, where the helper
# modules below are still found.
sys.path.append(sys.path.pop(0))

from off_policy import flowrl_updates_per_env_step, steady_window_callback  # noqa: E402
from time_to_solve import emit, finite, loadavg, machine_info, run_child, sb3_available, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "mujoco.json"
ALGOS = ("td3", "sac")
ENVS = {"Hopper-v5": "hopper", "HalfCheetah-v5": "halfcheetah", "Walker2d-v5": "walker2d"}
LAST_EPISODES = 20
STEPS = 50_000
TRIAL_TIMEOUT_S = 3600
RATIO_GOAL = 1.0


def tuned_example(algo: str, env_id: str) -> Path:
    """The tuned example both sides take their settings from."""
    return ROOT / "tuned_examples" / f"{ENVS[env_id]}-{algo}.yaml"


def flowrl_config(args: argparse.Namespace) -> Any:
    """The flowrl config of a trial: the tuned example's, with the benchmark's seed, threads and smoothing."""
    from flowrl.algorithms import get_algorithm
    from flowrl.cli.args import build_config
    from flowrl.runs.experiment import load_experiment_file

    file_config = dict(load_experiment_file(str(tuned_example(args.algo, args.env)))["config"])
    file_config.update(learner_threads=args.torch_threads, metrics_smoothing_episodes=LAST_EPISODES)
    if args.learning_starts is not None:
        file_config["learning_starts"] = args.learning_starts
    algorithm = get_algorithm(args.algo)
    namespace = argparse.Namespace(set=[], num_workers=None, seed=args.seed)
    return algorithm.config_class.from_dict(build_config(algorithm, file_config, namespace))


def shared_settings(config: Any) -> dict[str, Any]:
    """The settings SB3 takes from flowrl's config (the same names on both sides of the report)."""
    settings: dict[str, Any] = {
        "actor_hiddens": list(config.actor_hiddens),
        "critic_hiddens": list(config.critic_hiddens),
        "batch_size": config.train_batch_size,
        "buffer_size": config.buffer_size,
        "learning_starts": config.learning_starts,
        "gamma": config.gamma,
        "tau": config.tau,
        "twin_q": bool(config.twin_q),
    }
    if hasattr(config, "policy_delay"):  # TD3: one rate per network
        settings.update(
            actor_lr=config.actor_lr,
            critic_lr=config.critic_lr,
            exploration_noise=config.exploration_noise,
            policy_delay=config.policy_delay,
            target_noise=config.target_noise,
            target_noise_clip=config.target_noise_clip,
        )
    else:  # SAC: one rate for the actor, the critics and the entropy coefficient (SB3 has one)
        if any(rate is not None for rate in (config.actor_lr, config.critic_lr, config.alpha_lr)):
            raise SystemExit("SB3's SAC takes one learning rate: leave actor_lr, critic_lr and alpha_lr unset")
        settings.update(lr=config.lr, initial_alpha=config.initial_alpha, target_entropy=config.target_entropy)
    return settings


def steady_rate(steps: int, seconds: float, cpu_seconds: float) -> dict[str, Any]:
    return {
        "env_steps_per_s": steps / seconds if seconds > 0 else None,
        "env_steps_per_cpu_s": steps / cpu_seconds if cpu_seconds > 0 else None,
        "window_steps": steps,
        "window_s": seconds,
    }


# -- one flowrl trial (in its own process) ---------------------------------------------


def flowrl_trial(args: argparse.Namespace) -> dict[str, Any]:
    """Train flowrl ``args.algo`` with the tuned example until ``args.steps`` env steps."""
    load_start = loadavg()
    from flowrl.engine.trainer import Trainer

    config = flowrl_config(args)
    trainer = Trainer(args.algo, args.env, config.to_dict())
    history: list[list[Any]] = []
    window_start: tuple[int, float, float] | None = None
    result: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        while not history or history[-1][0] < args.steps:
            result = trainer.train()
            now, cpu_now = time.perf_counter(), time.process_time()
            steps = int(result["timesteps_total"])
            history.append([steps, finite(result.get("episode_reward_mean")), round(now - started, 3)])
            if window_start is None and steps >= config.learning_starts:
                window_start = (steps, now, cpu_now)
        wall_s = time.perf_counter() - started
    finally:
        trainer.stop()
    rate = steady_rate(0, 0.0, 0.0)
    if window_start is not None:
        rate = steady_rate(history[-1][0] - window_start[0], now - window_start[1], cpu_now - window_start[2])
    return {
        "kind": "flowrl",
        "algo": args.algo,
        "seed": args.seed,
        "final_return": finite(result.get("episode_reward_mean")),
        "episodes": result.get("episodes_total"),
        "env_steps": history[-1][0],
        "wall_s": wall_s,
        **rate,
        "settings": shared_settings(config),
        "updates_per_env_step": flowrl_updates_per_env_step(config),
        "torch_threads": args.torch_threads,
        "history": history,
        "loadavg_start_end": [load_start, loadavg()],
    }


# -- one SB3 trial (in its own process) ---------------------------------------------------


def sb3_model(algo: str, settings: dict[str, Any], env: Any, seed: int) -> Any:
    """SB3's ``algo`` with flowrl's settings, one gradient update per env step, on CPU."""
    import numpy as np
    from stable_baselines3 import SAC, TD3
    from stable_baselines3.common.noise import NormalActionNoise

    common = {
        "buffer_size": settings["buffer_size"],
        "learning_starts": settings["learning_starts"],
        "batch_size": settings["batch_size"],
        "tau": settings["tau"],
        "gamma": settings["gamma"],
        "train_freq": 1,
        "gradient_steps": 1,
        "device": "cpu",
        "seed": seed,
        "verbose": 0,
    }
    net_arch = {"pi": settings["actor_hiddens"], "qf": settings["critic_hiddens"]}
    n_critics = 2 if settings["twin_q"] else 1
    if algo == "td3":
        if settings["actor_lr"] != settings["critic_lr"]:
            raise SystemExit("SB3's TD3 has one learning rate: give actor_lr == critic_lr in the tuned example")
        n_actions = env.action_space.shape[0]
        noise = NormalActionNoise(np.zeros(n_actions), settings["exploration_noise"] * np.ones(n_actions))
        return TD3(
            "MlpPolicy",
            env,
            learning_rate=settings["actor_lr"],
            action_noise=noise,
            policy_delay=settings["policy_delay"],
            target_policy_noise=settings["target_noise"],
            target_noise_clip=settings["target_noise_clip"],
            policy_kwargs={"net_arch": net_arch, "n_critics": n_critics},
            **common,
        )
    return SAC(
        "MlpPolicy",
        env,
        learning_rate=settings["lr"],
        ent_coef=f"auto_{settings['initial_alpha']}",
        target_entropy=settings["target_entropy"],
        policy_kwargs={"net_arch": net_arch, "n_critics": n_critics},
        **common,
    )


def sb3_trial(args: argparse.Namespace) -> dict[str, Any]:
    """SB3's ``args.algo`` with the tuned example's settings for ``args.steps`` env steps."""
    load_start = loadavg()
    import numpy as np
    import stable_baselines3
    import torch
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(args.torch_threads)
    settings = shared_settings(flowrl_config(args))
    env = make_vec_env(args.env, n_envs=1, seed=args.seed)
    model = sb3_model(args.algo, settings, env, args.seed)
    callback = steady_window_callback(settings["learning_starts"])
    started = time.perf_counter()
    model.learn(total_timesteps=args.steps, callback=callback)
    done, cpu_done = time.perf_counter(), time.process_time()
    env.close()
    rate = steady_rate(0, 0.0, 0.0)
    if callback.started is not None:
        window_steps = int(model.num_timesteps) - settings["learning_starts"] - 1
        rate = steady_rate(window_steps, done - callback.started, cpu_done - callback.cpu_started)
    returns = [float(e["r"]) for e in model.ep_info_buffer][-LAST_EPISODES:]
    return {
        "kind": "sb3",
        "algo": args.algo,
        "seed": args.seed,
        "final_return": float(np.mean(returns)) if returns else None,
        "env_steps": int(model.num_timesteps),
        "wall_s": done - started,
        **rate,
        "settings": settings,
        "updates_per_env_step": 1.0,
        "torch_threads": torch.get_num_threads(),
        "sb3_version": stable_baselines3.__version__,
        "loadavg_start_end": [load_start, loadavg()],
    }


# -- the parent: alternating trials in fresh processes --------------------------------------


def run_trial(kind: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run one trial in a fresh Python process and return its JSON result (or a failure record)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trial", kind, "--algo", args.algo, "--env", args.env]
    cmd += ["--seed", str(seed), "--steps", str(args.steps), "--torch-threads", str(args.torch_threads)]
    if args.learning_starts is not None:
        cmd += ["--learning-starts", str(args.learning_starts)]
    print(f"\n-- {kind} {args.algo} {args.env} seed {seed} (load {loadavg()[0]:.2f})", flush=True)
    result = run_child(cmd, {"kind": kind, "algo": args.algo, "seed": seed}, args.trial_timeout)
    if "error" not in result:
        rate = result["env_steps_per_s"]
        print(
            f"   return {result['final_return']} (last {LAST_EPISODES} episodes) at {result['env_steps']} steps; "
            f"{rate:.1f} env steps/s after learning_starts"
            if rate is not None
            else f"   return {result['final_return']}; no steps after learning_starts",
            flush=True,
        )
    return result


def summarize(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and std of one side's final returns over the seeds, and its median steps/s."""
    returns = [t["final_return"] for t in trials if t.get("final_return") is not None]
    rates = [t["env_steps_per_s"] for t in trials if t.get("env_steps_per_s") is not None]
    cpu_rates = [t["env_steps_per_cpu_s"] for t in trials if t.get("env_steps_per_cpu_s") is not None]
    return {
        "trials": len(trials),
        "failed": sum("error" in t for t in trials),
        "mean_return": statistics.mean(returns) if returns else None,
        "std_return": statistics.pstdev(returns) if returns else None,
        "returns": returns,
        "median_env_steps_per_s": statistics.median(rates) if rates else None,
        "median_env_steps_per_cpu_s": statistics.median(cpu_rates) if cpu_rates else None,
        "updates_per_env_step": next((t["updates_per_env_step"] for t in trials if "updates_per_env_step" in t), None),
        "settings": next((t["settings"] for t in trials if "settings" in t), None),
    }


def goal(ours: dict[str, Any], sb3: dict[str, Any]) -> dict[str, Any]:
    """flowrl's mean return against SB3's mean minus one SB3 std, and the steps/s ratio against 1.0."""
    speed = None
    if ours["median_env_steps_per_s"] and sb3["median_env_steps_per_s"]:
        speed = ours["median_env_steps_per_s"] / sb3["median_env_steps_per_s"]
    returns_met = None
    if ours["mean_return"] is not None and sb3["mean_return"] is not None:
        returns_met = ours["mean_return"] >= sb3["mean_return"] - sb3["std_return"]
    return {
        "steps_per_s_ratio": speed,
        "steps_per_s_met": speed is not None and speed >= RATIO_GOAL,
        "return_met": returns_met,
        "goal": f"flowrl mean return >= SB3 mean - one SB3 std, at >= {RATIO_GOAL}x SB3's steps/s",
    }


def _cell(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    """Parse options; run one trial (``--trial``) or the whole alternating benchmark."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=ALGOS, default="td3", help="flowrl's and SB3's algorithm (default td3)")
    parser.add_argument("--env", choices=sorted(ENVS), default="Hopper-v5", help="the MuJoCo env (default Hopper-v5)")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2], help="one trial per side for each (default 0 1 2)"
    )
    parser.add_argument("--steps", type=int, default=STEPS, help=f"env steps per trial (default {STEPS})")
    parser.add_argument(
        "--learning-starts", type=int, help="override the tuned example's learning_starts on both sides (short runs)"
    )
    parser.add_argument("--torch-threads", type=int, default=1, help="PyTorch threads on both sides (default 1)")
    parser.add_argument("--no-sb3", action="store_true", help="skip stable-baselines3 even if it is installed")
    parser.add_argument("--trial-timeout", type=float, default=TRIAL_TIMEOUT_S, help="seconds before a trial is killed")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON figures")
    parser.add_argument("--trial", choices=("flowrl", "sb3"), help="run one trial in this process; print a JSON line")
    parser.add_argument("--seed", type=int, default=0, help="the seed of a --trial")
    args = parser.parse_args()

    if args.trial == "flowrl":
        emit(flowrl_trial(args))
        return
    if args.trial == "sb3":
        emit(sb3_trial(args))
        return

    from flowrl.algorithms import list_algorithms

    if args.algo not in list_algorithms():
        raise SystemExit(f"flowrl has no algorithm {args.algo!r} in this checkout; it has {list_algorithms()}")
    with_sb3 = sb3_available() and not args.no_sb3
    if not with_sb3:
        print("SB3 comparison skipped: " + ("--no-sb3" if args.no_sb3 else "stable-baselines3 is not installed"))
    kinds = ["flowrl", "sb3"] if with_sb3 else ["flowrl"]
    machine = machine_info()
    load_start, started = loadavg(), time.perf_counter()
    trials: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for seed in args.seeds:  # alternating: flowrl, then SB3, for each seed
        for kind in kinds:
            trials[kind].append(run_trial(kind, seed, args))
    load_end = loadavg()
    machine.update(loadavg_start=load_start, loadavg_end=load_end, note="1/5/15-minute load averages")
    summaries = {kind: summarize(ts) for kind, ts in trials.items()}
    outcome = goal(summaries["flowrl"], summaries["sb3"]) if with_sb3 else None

    print(
        f"\nmachine: {machine['cpu_count']} CPUs, torch {machine['torch']}, gymnasium {machine['gymnasium']}, "
        f"SB3 {machine['stable-baselines3'] or 'not installed'}; load {load_start[0]:.2f} -> {load_end[0]:.2f}; "
        f"torch threads {args.torch_threads} on both sides"
    )
    print(f"\n{args.algo} on {args.env}, {args.steps} env steps, seeds {args.seeds}")
    print(f"{'side':<8}{'mean return':>12}{'std':>8}{'steps/s':>9}{'steps/CPU-s':>13}{'upd/step':>9}  returns per seed")
    for kind, s in summaries.items():
        print(
            f"{kind:<8}{_cell(s['mean_return']):>12}{_cell(s['std_return']):>8}"
            f"{_cell(s['median_env_steps_per_s']):>9}{_cell(s['median_env_steps_per_cpu_s']):>13}"
            f"{_cell(s['updates_per_env_step'], 2):>9}  {[round(r, 1) for r in s['returns']]}"
        )
    if outcome is not None:
        print(
            f"flowrl / SB3 steps/s = {_cell(outcome['steps_per_s_ratio'], 2)}; "
            f"return goal {'met' if outcome['return_met'] else 'NOT met'} ({outcome['goal']})"
        )
    report = {
        "machine": machine,
        "settings": {
            "algo": args.algo,
            "env": args.env,
            "steps": args.steps,
            "seeds": args.seeds,
            "learning_starts_override": args.learning_starts,
            "torch_threads": args.torch_threads,
            "tuned_example": str(tuned_example(args.algo, args.env).relative_to(ROOT)),
            "final_return": f"mean return of the last {LAST_EPISODES} episodes at the step budget",
            "steady_window": "env steps after learning_starts to the end, over their wall (and CPU) time",
            "order": "alternating per seed: " + ", ".join(kinds),
            "total_benchmark_s": time.perf_counter() - started,
        },
        "results": summaries,
        "goal": outcome,
        "trials": trials,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
