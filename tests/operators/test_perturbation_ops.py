"""The perturbation-search vocabulary (ES, ARS) without a cluster: noise table, ranks, statistics,
antithetic evaluation on a local rollout worker, the NumPy actor, update directions and config checks."""

from __future__ import annotations

import pickle
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray
import torch
from fakes import from_list

from flowrl.actors import RolloutWorker, WorkerSet
from flowrl.actors.perturbation import NoiseTable, PerturbationEvaluator, PerturbationResult
from flowrl.algorithms.ars import ARSConfig, ars_direction, make_ars_policy
from flowrl.algorithms.es import ESConfig, es_gradient, make_es_policy
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.envs import get_env_creator
from flowrl.envs.episodes import run_episode
from flowrl.errors import ConfigError
from flowrl.operators import STEPS_SAMPLED_COUNTER
from flowrl.operators.perturbation_ops import (
    EVAL_EPISODES_COUNTER,
    PERTURBED_EPISODES_COUNTER,
    CollectPerturbations,
    UpdateObservationFilter,
    centered_ranks,
    count_perturbation_steps,
)
from flowrl.policy import Policy
from flowrl.policy.perturbable import FlatActor, RunningStats, ascend, flat_parameters
from flowrl.policy.perturbation_spec import num_perturbed_parameters

pytestmark = pytest.mark.unit


def result_of(
    indices: list[int], returns: list[tuple[float, float]], length: int = 10, **kwargs: Any
) -> PerturbationResult:
    returns_array = np.asarray(returns, dtype=np.float64)
    lengths = np.full(returns_array.shape, length, dtype=np.int64)
    return PerturbationResult(np.asarray(indices, dtype=np.int64), returns_array, lengths, **kwargs)


def local_worker(algo: str, env: str = "CartPole-v1", seed: int | None = 0, **config: Any) -> RolloutWorker:
    config_class, make_policy = (ESConfig, make_es_policy) if algo == "es" else (ARSConfig, make_ars_policy)
    cfg = config_class.from_dict({"num_workers": 0, "seed": seed, "noise_table_size": 10_000, **config})
    creator = get_env_creator(env)
    probe = creator({})
    spec = make_policy(probe.observation_space, probe.action_space, cfg)
    probe.close()
    return RolloutWorker(env_creator=creator, policy_specs={DEFAULT_POLICY_ID: spec}, config=cfg)


def evaluation_return(policy: Policy, env_id: str, seed: int) -> float:
    """The return of one episode acted as flowrl evaluates policies: compute_single_action(explore=False)."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(policy.compute_single_action(obs, explore=False))
        total += float(reward)
        done = terminated or truncated
    return total


def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))


# --- noise table --------------------------------------------------------------------------------


def test_noise_table_is_determined_by_its_seed() -> None:
    a, b, c = NoiseTable(1000, seed=3), NoiseTable(1000, seed=3), NoiseTable(1000, seed=4)
    assert a.array.dtype == np.float32 and a.array.shape == (1000,)
    np.testing.assert_array_equal(a.array, b.array)
    assert not np.array_equal(a.array, c.array)
    assert abs(float(NoiseTable(100_000, seed=0).array.std()) - 1.0) < 0.02


def test_noise_table_slices_and_indices_stay_inside() -> None:
    table = NoiseTable(50, seed=0)
    np.testing.assert_array_equal(table.get(7, 5), table.array[7:12])
    rng = np.random.default_rng(0)
    starts = {table.sample_index(rng, 48) for _ in range(200)}
    assert starts == {0, 1, 2}  # every start whose slice of 48 fits in 50 values, and no other
    table.check_dim(50)
    with pytest.raises(ConfigError, match="noise_table_size=50 < 51"):
        table.check_dim(51)


def test_noise_table_weighted_sum_matches_the_slices() -> None:
    table = NoiseTable(1000, seed=1)
    indices, weights = np.array([3, 500, 990, 3]), np.array([0.5, -2.0, 1.0, 0.25])
    expected = sum(w * table.get(i, 10).astype(np.float64) for w, i in zip(weights, indices))
    np.testing.assert_allclose(table.weighted_sum(weights, indices, 10), expected, rtol=1e-12)


def test_noise_table_pickles_as_an_object_store_reference(ray_session: None) -> None:
    table = NoiseTable(200_000, seed=0)
    payload = ray.cloudpickle.dumps(table)
    assert len(payload) < 10_000  # the 800 kB array is not in it
    assert table.object_ref() is table.object_ref()  # put once

    @ray.remote(num_cpus=0)
    def slice_in_a_worker(t: NoiseTable) -> np.ndarray:
        return np.array(t.get(123, 4))

    np.testing.assert_array_equal(ray.get(slice_in_a_worker.remote(table)), table.get(123, 4))
    # Unpickled in a process, a table fetches the array from the object store.
    copy = pickle.loads(payload)
    np.testing.assert_array_equal(copy.get(5, 3), table.get(5, 3))


# --- ranks and statistics -------------------------------------------------------------------------


def test_centered_ranks_exact_values() -> None:
    np.testing.assert_allclose(centered_ranks(np.array([[3.0, 1.0], [2.0, 5.0]])), [[1 / 6, -0.5], [-1 / 6, 0.5]])
    # Ties share their mean rank, so equal returns carry no spurious preference.
    np.testing.assert_allclose(centered_ranks(np.array([1.0, 1.0, 2.0])), [-0.25, -0.25, 0.5])
    np.testing.assert_allclose(centered_ranks(np.array([500.0, 500.0])), [0.0, 0.0])
    np.testing.assert_allclose(centered_ranks(np.array([7.0])), [0.0])
    ranks = centered_ranks(np.random.default_rng(0).normal(size=(10, 2)))
    assert ranks.shape == (10, 2) and ranks.min() == -0.5 and ranks.max() == 0.5 and abs(ranks.sum()) < 1e-12


def test_running_stats_merge_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    chunks = [rng.normal(loc=3.0, scale=[1.0, 10.0, 0.1], size=(n, 3)) for n in (1, 7, 50, 13)]
    merged = RunningStats(3)
    for chunk in chunks[:2]:
        merged.push(chunk)
    other = RunningStats.of(chunks[2])
    other.merge(RunningStats.of(chunks[3]))
    merged.merge(other)
    merged.merge(RunningStats(3))  # merging nothing changes nothing
    everything = np.concatenate(chunks)
    assert merged.count == len(everything)
    np.testing.assert_allclose(merged.mean, everything.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(merged.var, everything.var(axis=0), rtol=1e-10)
    np.testing.assert_allclose(merged.std, everything.std(axis=0), rtol=1e-10)


def test_normalization_is_identity_without_data_and_keeps_constant_components() -> None:
    shift, scale = RunningStats(2).normalization()
    np.testing.assert_array_equal(shift, [0.0, 0.0])
    np.testing.assert_array_equal(scale, [1.0, 1.0])
    shift, scale = RunningStats.of(np.array([[1.0, 5.0], [3.0, 5.0]])).normalization()
    np.testing.assert_array_equal(shift, [2.0, 5.0])
    np.testing.assert_array_equal(scale, [1.0, 1.0])  # std 1, and a zero std left unscaled


# --- results and collection ---------------------------------------------------------------------


def test_results_concat_take_and_count() -> None:
    a = result_of(
        [1, 2],
        [(1.0, 2.0), (3.0, 4.0)],
        length=5,
        eval_episodes=1,
        eval_steps=7,
        obs_stats=RunningStats.of(np.ones((4, 2))),
    )
    b = result_of([9], [(5.0, 6.0)], length=3, obs_stats=RunningStats.of(np.zeros((2, 2))))
    both = PerturbationResult.concat([a, b])
    assert both.noise_indices.tolist() == [1, 2, 9]
    assert both.returns.shape == (3, 2) and both.lengths.shape == (3, 2)
    assert both.perturbed_steps() == 26 and both.env_steps() == 33 and both.eval_episodes == 1
    assert both.obs_stats is not None and both.obs_stats.count == 6
    np.testing.assert_allclose(both.obs_stats.mean, [2 / 3, 2 / 3])
    first = both.take(2)
    assert first.num_pairs == 2 and first.noise_indices.tolist() == [1, 2]


def test_collect_perturbations_waits_for_episodes_and_steps() -> None:
    collect = CollectPerturbations(min_episodes=4, min_steps=50)
    assert collect(result_of([0], [(1, 1)], length=10)) == []  # 2 episodes, 20 steps
    assert collect(result_of([1], [(1, 1)], length=10)) == []  # 4 episodes, 40 steps
    (out,) = collect(result_of([2], [(1, 1)], length=10))  # 6 episodes, 60 steps
    assert out.noise_indices.tolist() == [0, 1, 2]
    assert collect.buffer == []  # emptied after each output
    (big,) = collect(result_of([3, 4], [(1, 1), (1, 1)], length=100))  # enough on its own
    assert big.noise_indices.tolist() == [3, 4]


# --- evaluating pairs on a rollout worker ---------------------------------------------------------


def test_antithetic_rounds_have_consistent_shapes_and_record_eval_episodes() -> None:
    worker = local_worker("es")
    noise = NoiseTable(10_000, seed=0)
    evaluator = PerturbationEvaluator(worker, noise, noise_stdev=0.1, eval_prob=1.0, collect_obs_stats=True)
    result = evaluator.run_round(3)
    dim = len(flat_parameters(worker.get_policy().model))
    assert result.noise_indices.shape == (3,) and result.returns.shape == (3, 2) and result.lengths.shape == (3, 2)
    assert ((result.noise_indices >= 0) & (result.noise_indices <= noise.size - dim)).all()
    np.testing.assert_array_equal(result.returns, result.lengths)  # CartPole pays 1 per step
    assert result.lengths.min() >= 1
    # eval_prob=1: one unperturbed episode per pair, in the worker's episode statistics.
    episodes = worker.get_metrics().episodes
    assert result.eval_episodes == len(episodes) == 3
    assert result.eval_steps == sum(e["episode_length"] for e in episodes)
    assert result.obs_stats is not None and result.obs_stats.count == result.perturbed_steps()
    assert worker.sampler.steps_sampled == 0  # the worker's own sampler never ran


def test_rounds_are_reproducible_from_the_worker_seed_and_differ_across_seeds() -> None:
    def run(seed: int) -> PerturbationResult:
        evaluator = PerturbationEvaluator(
            local_worker("ars", seed=seed),
            NoiseTable(10_000, seed=0),
            noise_stdev=0.5,
            eval_prob=0.5,
            collect_obs_stats=False,
        )
        return evaluator.run_round(4)

    first, again, other = run(1), run(1), run(2)
    np.testing.assert_array_equal(first.noise_indices, again.noise_indices)
    np.testing.assert_array_equal(first.returns, again.returns)
    assert not np.array_equal(first.noise_indices, other.noise_indices)
    assert first.obs_stats is None


@pytest.mark.parametrize(("algo", "env"), [("es", "CartPole-v1"), ("ars", "Pendulum-v1"), ("es", "Pendulum-v1")])
def test_the_numpy_actor_acts_like_the_policy_at_evaluation(algo: str, env: str) -> None:
    worker = local_worker(algo, env, model={"fcnet_hiddens": [8]})
    policy = worker.get_policy()
    randomize(policy.model)
    obs_space = worker.envs[0].observation_space
    observations = np.random.default_rng(0).uniform(-2, 2, size=(50, *obs_space.shape)).astype(np.float32)
    policy.model.set_observation_stats(RunningStats.of(observations[:20] * 3 + 1))
    actor = FlatActor(policy.model, worker.envs[0].action_space, clip_actions=False)
    actor.set_parameters(flat_parameters(policy.model))
    actor.set_normalization(policy.model.obs_shift.numpy(), policy.model.obs_scale.numpy())
    actions, _ = policy.compute_actions(observations, explore=False)
    mine = np.array([actor(obs) for obs in observations])
    if isinstance(worker.envs[0].action_space, gym.spaces.Discrete):
        np.testing.assert_array_equal(mine, actions)
    else:
        np.testing.assert_allclose(mine, actions, rtol=1e-5, atol=1e-5)
    # Whole episodes: what training reports for the unperturbed weights is what evaluation measures.
    for seed in (0, 1):
        reward, _ = run_episode(worker.envs[0], lambda obs, info: actor(obs), seed)
        assert reward == pytest.approx(evaluation_return(policy, env, seed), rel=1e-5)


def test_the_numpy_actor_clips_box_actions() -> None:
    worker = local_worker("ars", "Pendulum-v1")
    model = worker.get_policy().model
    actor = FlatActor(model, worker.envs[0].action_space)
    actor.set_parameters(np.full(actor.dim, 100.0, dtype=np.float32))
    assert actor(np.ones(3, dtype=np.float32)).tolist() == [2.0]


# --- updates ------------------------------------------------------------------------------------


def toy_result(
    theta: np.ndarray, target: np.ndarray, noise: NoiseTable, sigma: float, pairs: int
) -> PerturbationResult:
    """Antithetic returns of the objective -|theta - target|^2."""
    rng = np.random.default_rng(0)
    indices = np.array([noise.sample_index(rng, len(theta)) for _ in range(pairs)])
    returns = []
    for i in indices:
        eps = noise.get(int(i), len(theta)).astype(np.float64)
        returns.append([-np.sum((theta + s * sigma * eps - target) ** 2) for s in (1, -1)])
    return result_of(indices.tolist(), returns)


def test_es_and_ars_directions_point_uphill_on_a_toy_objective() -> None:
    noise = NoiseTable(100_000, seed=0)
    theta, target = np.zeros(20), np.linspace(-1, 1, 20)
    result = toy_result(theta, target, noise, sigma=0.1, pairs=400)
    uphill = target - theta
    for direction in (es_gradient(result, noise, 20, 0.1), ars_direction(result, noise, 20, rollouts_used=100)[0]):
        cosine = direction @ uphill / (np.linalg.norm(direction) * np.linalg.norm(uphill))
        assert cosine > 0.5


def test_es_gradient_points_along_a_linear_objective() -> None:
    noise = NoiseTable(200_000, seed=2)
    # Returns r = w . (theta + sigma eps) around theta = 0 are +-sigma w . eps; their centered
    # ranks are a monotone function of them, so the estimate still points along w.
    w = np.array([1.0, -2.0, 0.5, 0.0, 3.0])
    rng = np.random.default_rng(1)
    indices = np.array([noise.sample_index(rng, 5) for _ in range(2000)])
    diffs = np.array([w @ noise.get(int(i), 5) for i in indices])
    result = result_of(indices.tolist(), [(0.1 * d, -0.1 * d) for d in diffs])
    direction = es_gradient(result, noise, 5, 0.1)
    assert np.corrcoef(direction, w)[0, 1] > 0.95


def test_ars_uses_the_top_directions_and_scales_by_their_std() -> None:
    noise = NoiseTable(1000, seed=0)
    result = result_of([0, 10, 20], [(5.0, 1.0), (0.0, 0.0), (2.0, 8.0)])
    direction, sigma_r = ars_direction(result, noise, 4, rollouts_used=2)
    used = np.array([5.0, 1.0, 2.0, 8.0])  # pairs 0 and 2 have the largest max(r+, r-)
    assert sigma_r == pytest.approx(used.std())
    expected = (4.0 * noise.get(0, 4) + (-6.0) * noise.get(20, 4)) / (2 * used.std())
    np.testing.assert_allclose(direction, expected, rtol=1e-6)


def test_ascend_steps_the_optimizer_up_the_direction_with_l2_decay() -> None:
    worker = local_worker("es", optimizer="sgd", sgd_momentum=0.0, stepsize=0.5)
    policy = worker.get_policy()
    theta = flat_parameters(policy.model)
    direction = np.linspace(-1, 1, len(theta))
    ascend(policy, direction, l2_coeff=0.1)
    np.testing.assert_allclose(
        flat_parameters(policy.model), theta + 0.5 * (direction - 0.1 * theta), rtol=1e-5, atol=1e-6
    )
    assert policy.get_state()["optimizer"]["param_groups"][0]["lr"] == 0.5


def test_update_observation_filter_merges_into_the_model_buffers() -> None:
    creator = get_env_creator("CartPole-v1")
    probe = creator({})
    spec = make_ars_policy(probe.observation_space, probe.action_space, ARSConfig.from_dict({"num_workers": 0}))
    workers = WorkerSet(env_creator=creator, policy_specs={DEFAULT_POLICY_ID: spec}, config={}, num_workers=0)
    model = workers.local_worker().get_policy().model
    rng = np.random.default_rng(0)
    first, second = rng.normal(2.0, 3.0, size=(30, 4)), rng.normal(-1.0, 0.5, size=(70, 4))
    update = UpdateObservationFilter(workers)
    update(result_of([0], [(0, 0)], obs_stats=RunningStats.of(first)))
    update(result_of([0], [(0, 0)]))  # no statistics: nothing changes
    update(result_of([0], [(0, 0)], obs_stats=RunningStats.of(second)))
    everything = np.concatenate([first, second])
    assert float(model.obs_count) == 100
    np.testing.assert_allclose(model.obs_shift.numpy(), everything.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(model.obs_scale.numpy(), everything.std(axis=0), rtol=1e-5)
    workers.stop()


def test_count_perturbation_steps_counts_every_env_step() -> None:
    it = from_list([result_of([0, 1], [(1, 1), (1, 1)], length=10, eval_episodes=1, eval_steps=4)])
    list(it.for_each(count_perturbation_steps))
    counters = it.shared_metrics.get().counters
    assert counters[STEPS_SAMPLED_COUNTER] == 44
    assert counters[PERTURBED_EPISODES_COUNTER] == 4 and counters[EVAL_EPISODES_COUNTER] == 1


# --- configs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config_class", "values", "message"),
    [
        (ESConfig, {"noise_stdev": 0.0}, "noise_stdev"),
        (ESConfig, {"optimizer": "rmsprop"}, "optimizer"),
        (ESConfig, {"eval_prob": 1.5}, "eval_prob"),
        (ESConfig, {"episodes_per_batch": 1}, "episodes_per_batch"),
        (ESConfig, {"explore": True}, "explore=True"),
        (ESConfig, {"lr": 0.1}, "lr=0.1"),
        (ESConfig, {"num_envs_per_worker": 4}, "num_envs_per_worker"),
        (ARSConfig, {"rollouts_used": 40, "num_rollouts": 8}, "rollouts_used=40 > num_rollouts=8"),
        (ARSConfig, {"observation_filter": "ZFilter"}, "observation_filter"),
        (ARSConfig, {"sgd_stepsize": -1.0}, "sgd_stepsize"),
        (ARSConfig, {"noise_table_size": 0}, "noise_table_size"),
    ],
)
def test_bad_config_values_raise_config_errors(config_class: type, values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        config_class.from_dict(values)


def test_defaults_validate_and_policies_get_the_step_sizes() -> None:
    es, ars = ESConfig.from_dict({}), ARSConfig.from_dict({})
    assert es.stepsize == 0.01 and es.explore is False
    assert ars.sgd_stepsize == 0.02 and ars.model == {"fcnet_hiddens": []}


@pytest.mark.parametrize(
    ("obs_space", "action_space", "hiddens"),
    [
        (gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2), [16, 8]),
        (gym.spaces.Box(-1, 1, (3, 2), np.float32), gym.spaces.Box(-2, 2, (3,), np.float32), [5]),
        (gym.spaces.Box(-1, 1, (6,), np.float32), gym.spaces.Discrete(4), []),  # linear (ARS)
    ],
)
def test_the_parameter_count_read_from_the_spec_is_the_built_models(
    obs_space: gym.Space, action_space: gym.Space, hiddens: list[int]
) -> None:
    """The noise table is checked against this count when the plan is built, before any policy exists."""
    spec = make_es_policy(obs_space, action_space, ESConfig.from_dict({"model": {"fcnet_hiddens": hiddens}}))
    assert num_perturbed_parameters(spec) == len(flat_parameters(spec.build().model))
