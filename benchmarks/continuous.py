"""Benchmark continuous control: flowrl's TD3, DDPG and SAC against Stable-Baselines3's TD3 and SAC on Pendulum-v1.

What it measures:

1. Env steps per second in the steady training phase, after ``learning_starts``: flowrl's TD3,
   DDPG and SAC with their tuned examples (``tuned_examples/pendulum-{td3,ddpg,sac}.yaml``;
   exactly what ``flowrl train --config FILE --seed S`` builds) against SB3's TD3 (flowrl's TD3
   and DDPG) and SAC (flowrl's SAC) with rl-baselines3-zoo's Pendulum-v1 hyperparameters
   (``continuous_sb3.SB3_ZOO``). Both sides make one gradient update per env step, with the same
   network sizes, batch size and number of PyTorch threads: by default SB3 takes the tuned
   example's sizes and batch size (TD3's for SB3's TD3, SAC's for its SAC); with ``--zoo-sizes``
   flowrl takes the zoo's (TD3: [400, 300]; SAC: [256, 256]; SB3's batch of 256). flowrl's rate is
   taken over the ``train()`` calls that start after ``learning_starts`` (the first one past it is
   the window's start); SB3's from the env step
   after its ``learning_starts`` to the end of ``learn()``, ``--measure-steps`` steps later.

2. For flowrl, whether each algorithm's ``episode_reward_mean`` (the tuned example's
   smoothing window) reaches -250 within 30k env steps, and at which step: a flowrl trial runs
   until then (or its step budget), so its steady window is all of it after ``learning_starts``.

Each trial runs in a fresh Python process (``--trial flowrl|sb3``); the trials alternate
(flowrl TD3, DDPG, SAC, SB3 TD3, SAC, then the next repetition), ``--reps`` of them (default 3),
and the figures are the medians; the ratio is median flowrl steps/s over median SB3 steps/s
(goal: >= 1.0 for every algorithm). On a shared machine other load moves every figure: the
1-minute load average is recorded around each trial, and steps per CPU second of the trial's
process (the same window), which other load moves less, are reported beside steps/s.

Run from the repository root::

    python benchmarks/continuous.py                    # 3 repetitions: about 15 minutes on 2 cores
    python benchmarks/continuous.py --quick            # 1 repetition, short windows, no learning check
    python benchmarks/continuous.py --algos sac        # flowrl's SAC against SB3's SAC only
    python benchmarks/continuous.py --zoo-sizes        # both sides with the zoo's networks, batch 256
    python benchmarks/continuous.py --trial flowrl --algo td3 --seed 0   # one trial; prints a JSON line

It prints a table and writes the figures as JSON to ``--out`` (default
``benchmarks/results/continuous.json``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from continuous_sb3 import SB3_ZOO, ZOO_SIZES, sb3_trial  # benchmarks/ is on the path
from off_policy import flowrl_updates_per_env_step
from time_to_solve import (
    emit,
    finite,
    loadavg,
    machine_info,
    run_child,
    sb3_available,
    write_report,
)

ENV_ID = "Pendulum-v1"
TARGET_REWARD = -250.0
LEARNING_BUDGET = 30_000
MEASURE_STEPS = 5_000
REPS = 3
RATIO_GOAL = 1.0
TRIAL_TIMEOUT_S = 1800
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "continuous.json"
ALGOS = ("td3", "ddpg", "sac")
TUNED_EXAMPLES = {algo: f"tuned_examples/pendulum-{algo}.yaml" for algo in ALGOS}
#: The SB3 algorithm each flowrl algorithm is compared with.
SB3_OF = {"td3": "td3", "ddpg": "td3", "sac": "sac"}


def tuned_config(algo: str) -> dict[str, Any]:
    """The tuned example's config, as ``flowrl train --config FILE`` reads it."""
    from flowrl.runs.experiment import load_experiment_file

    return dict(load_experiment_file(str(ROOT / TUNED_EXAMPLES[algo]))["config"])


def flowrl_sizes(config: dict[str, Any], algo: str) -> dict[str, Any]:
    """Network sizes and batch size of a DDPG, TD3 or SAC config (the algorithm's defaults where it leaves them out)."""
    from flowrl.algorithms import get_algorithm

    full = get_algorithm(algo).config_class.from_dict(config)
    return {
        "actor_hiddens": list(full.actor_hiddens),
        "critic_hiddens": list(full.critic_hiddens),
        "batch_size": full.train_batch_size,
    }


# -- one flowrl trial (in its own process) ---------------------------------------------


def flowrl_trial(algo: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Train flowrl ``algo`` (tuned example) until -250 is reached (or the budget) and the steady window
    is long enough."""
    load_start = loadavg()
    from flowrl.algorithms import get_algorithm
    from flowrl.cli.args import build_config
    from flowrl.engine.trainer import Trainer

    overrides: dict[str, Any] = {"learner_threads": args.torch_threads}
    if args.zoo_sizes:
        zoo = ZOO_SIZES[SB3_OF[algo]]
        overrides.update(
            actor_hiddens=zoo["hiddens"], critic_hiddens=zoo["hiddens"], train_batch_size=zoo["batch_size"]
        )
    file_config = {**tuned_config(algo), **overrides}
    config = build_config(get_algorithm(algo), file_config, argparse.Namespace(set=[], num_workers=None, seed=seed))
    trainer = Trainer(algo, ENV_ID, config)
    learning_starts = trainer.config.learning_starts
    history: list[list[Any]] = []
    window_start: tuple[int, float, float] | None = None
    reached_at: int | None = None
    result: dict[str, Any] = {}
    try:
        while True:
            result = trainer.train()
            now, cpu_now = time.perf_counter(), time.process_time()
            steps = int(result["timesteps_total"])
            reward = finite(result.get("episode_reward_mean"))
            history.append([steps, reward, round(now, 3)])
            if window_start is None and steps >= learning_starts:
                window_start = (steps, now, cpu_now)
            if reached_at is None and reward is not None and reward >= args.target:
                reached_at = steps
            window = steps - window_start[0] if window_start is not None else 0
            learning_done = args.no_learning or reached_at is not None or steps >= args.budget
            if (learning_done and window >= args.measure_steps) or steps >= max(
                args.budget, learning_starts + args.measure_steps
            ):
                break
        sizes = flowrl_sizes(trainer.config.to_dict(), algo)
        rate_config = trainer.config
    finally:
        trainer.stop()
    assert window_start is not None
    window_steps, window_s = history[-1][0] - window_start[0], history[-1][2] - window_start[1]
    window_cpu_s = cpu_now - window_start[2]
    return {
        "kind": "flowrl",
        "algo": algo,
        "seed": seed,
        "env_steps_per_s": window_steps / window_s if window_s > 0 else None,
        "window_steps": window_steps,
        "window_s": window_s,
        "env_steps_per_cpu_s": window_steps / window_cpu_s if window_cpu_s > 0 else None,
        "reached": reached_at is not None,
        "reached_at_step": reached_at,
        "final_reward_mean": finite(result.get("episode_reward_mean")),
        "env_steps": history[-1][0],
        "sizes": sizes,
        "updates_per_env_step": flowrl_updates_per_env_step(rate_config),
        "learning_starts": learning_starts,
        "torch_threads": args.torch_threads,
        "plan": result.get("plan", {}),
        "history": [[s, r, round(t - history[0][2], 3)] for s, r, t in history],
        "loadavg_start_end": [load_start, loadavg()],
    }


# -- one SB3 trial (in its own process): continuous_sb3.py -----------------------------------


def sb3_sizes(algo: str, args: argparse.Namespace) -> dict[str, Any]:
    """The sizes SB3's ``algo`` takes: the zoo's with ``--zoo-sizes``, else flowrl's tuned example's."""
    if args.zoo_sizes:
        zoo = ZOO_SIZES[algo]
        return {"actor_hiddens": zoo["hiddens"], "critic_hiddens": zoo["hiddens"], "batch_size": zoo["batch_size"]}
    return flowrl_sizes(tuned_config(algo), algo)


# -- the parent: alternating trials in fresh processes --------------------------------------


def run_trial(kind: str, algo: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run one trial in a fresh Python process and return its JSON result (or a failure record)."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--trial",
        kind,
        "--algo",
        algo,
        "--seed",
        str(seed),
        "--target",
        str(args.target),
        "--budget",
        str(args.budget),
        "--measure-steps",
        str(args.measure_steps),
        "--torch-threads",
        str(args.torch_threads),
    ]
    cmd += ["--zoo-sizes"] * args.zoo_sizes + ["--no-learning"] * args.no_learning
    print(f"\n-- {kind} {algo} seed {seed} (load {loadavg()[0]:.2f})", flush=True)
    result = run_child(cmd, {"kind": kind, "algo": algo, "seed": seed, "env_steps_per_s": None}, args.trial_timeout)
    if "error" not in result:
        learned = ""
        if kind == "flowrl" and not args.no_learning:
            learned = (
                f", reached {args.target:g} at step {result['reached_at_step']}"
                if result["reached"]
                else f", did NOT reach {args.target:g} in {result['env_steps']} steps"
            )
        print(
            f"   {result['env_steps_per_s']:.1f} env steps/s ({result['env_steps_per_cpu_s']:.1f} per CPU second) "
            f"over {result['window_steps']} steps{learned}",
            flush=True,
        )
    return result


def summarize(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Median steps/s and the learning outcome of one variant's trials."""
    rates = [t["env_steps_per_s"] for t in trials if t.get("env_steps_per_s") is not None]
    cpu_rates = [t["env_steps_per_cpu_s"] for t in trials if t.get("env_steps_per_cpu_s") is not None]
    reached = [t["reached_at_step"] for t in trials if t.get("reached")]
    return {
        "trials": len(trials),
        "median_env_steps_per_s": statistics.median(rates) if rates else None,
        "env_steps_per_s": rates,
        "median_env_steps_per_cpu_s": statistics.median(cpu_rates) if cpu_rates else None,
        "reached": len(reached) if trials and "reached" in trials[0] else None,
        "reached_at_steps": reached,
        "final_reward_means": [t.get("final_reward_mean") for t in trials],
        "sizes": trials[0].get("sizes") if trials else None,
        "updates_per_env_step": trials[0].get("updates_per_env_step") if trials else None,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def print_plan_shares(trial: dict[str, Any]) -> None:
    """Where one flowrl trial's driver time went in its last iteration, by plan operator."""
    print(f"\nWhere the time went: flowrl {trial['algo']} seed {trial['seed']} (result['plan'], its last iteration)")
    print(f"  {'operator':<44}{'items':>8}{'ms':>10}{'share':>8}")
    for name, stats in trial["plan"].get("operators", {}).items():
        print(f"  {name[:44]:<44}{stats['items']:>8}{1000 * stats['time_s']:>10.1f}{100 * stats['share']:>7.1f}%")


def main() -> None:
    """Parse options; run one trial (``--trial``) or the whole alternating benchmark."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON figures")
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: 1 repetition, 1000-step windows, no learning check"
    )
    parser.add_argument("--reps", type=int, help=f"repetitions (default {REPS})")
    parser.add_argument(
        "--algos", nargs="+", choices=ALGOS, default=list(ALGOS), help="flowrl algorithms (default: both)"
    )
    parser.add_argument(
        "--measure-steps", type=int, help=f"least steady-phase env steps timed (default {MEASURE_STEPS})"
    )
    parser.add_argument("--target", type=float, default=TARGET_REWARD, help="episode_reward_mean flowrl must reach")
    parser.add_argument("--budget", type=int, default=LEARNING_BUDGET, help="env steps flowrl has to reach it")
    parser.add_argument("--no-learning", action="store_true", help="stop flowrl trials after the timing window")
    parser.add_argument(
        "--zoo-sizes", action="store_true", help="both sides with the zoo's [400, 300] networks and batch 256"
    )
    parser.add_argument("--torch-threads", type=int, default=1, help="PyTorch threads on both sides (default 1)")
    parser.add_argument("--no-sb3", action="store_true", help="skip stable-baselines3 even if it is installed")
    parser.add_argument("--trial-timeout", type=float, default=TRIAL_TIMEOUT_S, help="seconds before a trial is killed")
    parser.add_argument("--trial", choices=("flowrl", "sb3"), help="run one trial in this process; print a JSON line")
    parser.add_argument("--algo", choices=ALGOS, default="td3", help="the algorithm of a --trial (SB3: td3 or sac)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of a --trial")
    args = parser.parse_args()
    args.measure_steps = args.measure_steps or (1000 if args.quick else MEASURE_STEPS)
    args.no_learning = args.no_learning or args.quick

    if args.trial == "flowrl":
        emit(flowrl_trial(args.algo, args.seed, args))
        return
    if args.trial == "sb3":
        sizes = sb3_sizes(args.algo, args)
        emit(sb3_trial(args.algo, ENV_ID, args.seed, sizes, args.measure_steps, args.torch_threads))
        return

    reps = args.reps or (1 if args.quick else REPS)
    with_sb3 = sb3_available() and not args.no_sb3
    sb3_note = None
    if not with_sb3:
        sb3_note = (
            "skipped: --no-sb3"
            if args.no_sb3
            else "skipped: stable-baselines3 is not installed (pip install 'flowrl-ray[bench]')"
        )
        print(f"SB3 comparison {sb3_note}")
    sb3_algos = sorted({SB3_OF[algo] for algo in args.algos}, key=list(SB3_ZOO).index) if with_sb3 else []
    variants = [("flowrl", algo) for algo in args.algos] + [("sb3", algo) for algo in sb3_algos]
    machine = machine_info()
    load_start = loadavg()
    started = time.perf_counter()
    trials: dict[str, list[dict[str, Any]]] = {f"{kind} {algo}": [] for kind, algo in variants}
    for rep in range(reps):  # alternating: every variant once, then the next repetition (seed = repetition)
        for kind, algo in variants:
            trials[f"{kind} {algo}"].append(run_trial(kind, algo, rep, args))
    load_end = loadavg()
    machine.update(
        loadavg_start=load_start,
        loadavg_end=load_end,
        note="1/5/15-minute load averages; on a shared machine other processes' load slows every trial",
    )

    summaries = {name: summarize(ts) for name, ts in trials.items()}
    ratios: dict[str, Any] = {}
    for algo in args.algos:
        ours, sb3 = summaries[f"flowrl {algo}"], summaries.get(f"sb3 {SB3_OF[algo]}", {})
        value = _ratio(ours["median_env_steps_per_s"], sb3.get("median_env_steps_per_s"))
        ratios[algo] = {
            "sb3_algo": SB3_OF[algo],
            "flowrl_over_sb3": value,
            "goal": f">= {RATIO_GOAL}",
            "met": value is not None and value >= RATIO_GOAL,
            "per_cpu_second": _ratio(ours["median_env_steps_per_cpu_s"], sb3.get("median_env_steps_per_cpu_s")),
        }

    print(
        f"\nmachine: {machine['cpu_count']} CPUs ({machine.get('cpu_model', '?')}), Python {machine['python']}, "
        f"torch {machine['torch']}, gymnasium {machine['gymnasium']}, "
        f"SB3 {machine['stable-baselines3'] or 'not installed'}; "
        f"load {load_start[0]:.2f} -> {load_end[0]:.2f}; torch threads {args.torch_threads} on both sides"
    )
    print(f"\nSteady-phase env steps/s on {ENV_ID} (after learning_starts), {reps} repetition(s), medians")
    print(
        f"{'variant':<14}{'steps/s':>9}{'vs SB3':>8}{'steps/CPU-s':>13}{'vs SB3':>8}  "
        f"{'sizes (actor, critic, batch)':<32}"
        f"{'upd/step':>9}  learning"
    )
    for name, s in summaries.items():
        rate, cpu_rate = s["median_env_steps_per_s"], s["median_env_steps_per_cpu_s"]
        algo = name.split()[1]
        vs = ratios.get(algo, {}).get("flowrl_over_sb3") if name.startswith("flowrl") else None
        vs_cpu = ratios.get(algo, {}).get("per_cpu_second") if name.startswith("flowrl") else None
        sizes = s["sizes"] or {}
        shown_sizes = f"{sizes.get('actor_hiddens')}, {sizes.get('critic_hiddens')}, {sizes.get('batch_size')}"
        learning = "-"
        if name.startswith("flowrl") and not args.no_learning:
            learning = f"{s['reached']}/{s['trials']} reached {args.target:g} (at {s['reached_at_steps']})"
        print(
            f"{name:<14}{rate if rate is not None else float('nan'):>9.1f}{f'{vs:.2f}x' if vs else '':>8}"
            f"{cpu_rate if cpu_rate is not None else float('nan'):>13.1f}{f'{vs_cpu:.2f}x' if vs_cpu else '':>8}  "
            f"{shown_sizes:<32}{s['updates_per_env_step'] or 0:>9.2f}  {learning}"
        )
    for algo, r in ratios.items():
        if r["flowrl_over_sb3"] is not None:
            shown = f"{algo}: flowrl / SB3 {r['sb3_algo'].upper()} steps/s = {r['flowrl_over_sb3']:.2f}"
            print(f"{shown} (goal {r['goal']}): {'met' if r['met'] else 'NOT met'}")
    for algo in args.algos:
        ran = sorted((t for t in trials[f"flowrl {algo}"] if "plan" in t), key=lambda t: t["env_steps_per_s"])
        if ran:
            print_plan_shares(ran[len(ran) // 2])

    report = {
        "machine": machine,
        "settings": {
            "env": ENV_ID,
            "reps": reps,
            "order": "alternating per repetition: " + ", ".join(trials),
            "measure_steps": args.measure_steps,
            "torch_threads": args.torch_threads,
            "learning_check": None
            if args.no_learning
            else {"target": args.target, "budget": args.budget, "metric": "episode_reward_mean"},
            "flowrl_config_files": {algo: TUNED_EXAMPLES[algo] for algo in args.algos},
            "sizes": "the zoo's [400, 300] and batch 256 on both sides"
            if args.zoo_sizes
            else "each SB3 algorithm's tuned example's network sizes and batch size on both sides",
            "sb3": {
                "hyperparameters": {algo: SB3_ZOO[algo] for algo in sb3_algos},
                "note": "rl-zoo Pendulum-v1 TD3 settings; net_arch and batch_size "
                "as in 'sizes'; torch threads as in 'torch_threads'; device cpu",
            }
            if with_sb3
            else sb3_note,
            "steady_window": "flowrl: from the end of the first train() call past learning_starts to the last; "
            "SB3: from the first env step past learning_starts to the end of learn()",
            "total_benchmark_s": time.perf_counter() - started,
        },
        "results": summaries,
        "ratios": ratios,
        "goal": f"median flowrl steps/s / median SB3 steps/s (TD3's for TD3 and DDPG, SAC's for SAC) >= {RATIO_GOAL}",
        "trials": trials,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
