"""RLlib configs read as flowrl's: renamed, nested and ignored keys, notes, and RLlib's tuned examples."""

from __future__ import annotations

import argparse
import json
import re
import warnings
from pathlib import Path
from typing import Any, Iterator

import pytest

from flowrl.algorithms import get_algorithm, list_algorithms
from flowrl.cli.args import build_config
from flowrl.cli.main import main
from flowrl.config import TrainerConfig
from flowrl.config import rllib as rllib_compat
from flowrl.config.rllib import (
    IGNORED,
    IGNORED_AT,
    MODEL_IGNORED,
    NESTED,
    NESTED_IGNORED,
    NOT_IMPLEMENTED,
    RENAMED,
    RLlibConfigNote,
    RLlibPolicyMapping,
    translate_rllib_config,
)
from flowrl.errors import ConfigError
from flowrl.policy.model_options import DEFAULT_MODEL_CONFIG
from flowrl.runs.experiment import load_experiment_file

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
RLLIB_EXAMPLES = sorted((REPO / "tuned_examples" / "rllib").glob("*.yaml"))


def config_of(algo: str, values: dict[str, Any]) -> Any:
    return get_algorithm(algo).config_class.from_dict(values)


def translate(algo: str, values: dict[str, Any]) -> rllib_compat.Translation:
    cls = get_algorithm(algo).config_class
    return translate_rllib_config(
        cls, values, {name: value for name, value in cls.from_dict({}).to_dict(jsonable=False).items()}
    )


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test sees the notes as a new process would (they are shown once per process); tests that
    look at them record them, the others keep them out of the warnings summary."""
    monkeypatch.setattr(rllib_compat, "_shown", set())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RLlibConfigNote)
        yield


@pytest.mark.parametrize(
    ("algo", "rllib", "flowrl_key", "value"),
    [
        ("ppo", {"num_rollout_workers": 3}, "num_workers", 3),
        ("dqn", {"min_time_s_per_reporting": 5}, "min_iter_time_s", 5.0),
        ("dqn", {"min_time_s_per_iteration": None}, "min_iter_time_s", 0.0),
        ("dqn", {"min_sample_timesteps_per_reporting": 1000}, "timesteps_per_iteration", 1000),
        ("ddpg", {"min_sample_timesteps_per_iteration": 600}, "timesteps_per_iteration", 600),
        ("ppo", {"metrics_num_episodes_for_smoothing": 20}, "metrics_smoothing_episodes", 20),
        ("dqn", {"num_steps_sampled_before_learning_starts": 500}, "learning_starts", 500),
        ("pg", {"sgd_stepsize": 0.002}, "lr", 0.002),
        ("es", {"noise_size": 1_000_000}, "noise_table_size", 1_000_000),
        ("ppo", {"sample_batch_size": 50}, "rollout_fragment_length", 50),
        ("apex", {"optimizer": {"num_replay_buffer_shards": 3}}, "num_replay_shards", 3),
        ("apex", {"optimizer": {"max_weight_sync_delay": 100}}, "max_weight_sync_delay", 100),
        ("dqn", {"replay_buffer_config": {"capacity": 2000}}, "buffer_size", 2000),
        ("dqn", {"replay_buffer_config": {"learning_starts": 64}}, "learning_starts", 64),
        ("dqn", {"replay_buffer_config": {"min_size_for_sampling": 64}}, "learning_starts", 64),
        ("dqn", {"replay_buffer_config": {"prioritized_replay_alpha": 0.5}}, "prioritized_replay_alpha", 0.5),
        ("dqn", {"replay_buffer_config": {"type": "MultiAgentReplayBuffer"}}, "prioritized_replay", False),
        ("ddpg", {"replay_buffer_config": {"type": "MultiAgentPrioritizedReplayBuffer"}}, "prioritized_replay", True),
        ("ppo", {"disable_env_checking": True}, "check_env", False),
        ("ppo", {"evaluation_duration": 4}, "evaluation_num_episodes", 4),
        ("ppo", {"observation_filter": "ConcurrentMeanStdFilter"}, "observation_filter", "MeanStdFilter"),
    ],
)
def test_each_rllib_name_becomes_flowrls_key_with_one_note(
    algo: str, rllib: dict[str, Any], flowrl_key: str, value: Any
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = config_of(algo, rllib)
        config_of(algo, rllib)  # read again (as the CLI and the Trainer both do): no second note
    assert getattr(config, flowrl_key) == value
    notes = [str(w.message) for w in caught if w.category is RLlibConfigNote]
    assert len(notes) == 1, notes
    [(outer, inner)] = rllib.items()
    rllib_name = f"{outer}.{next(iter(inner))}" if isinstance(inner, dict) else outer
    assert rllib_name in notes[0] and flowrl_key in notes[0]


def test_framework_tf_runs_on_pytorch_with_one_note_and_torch_says_nothing() -> None:
    for framework in ("tf", "tf2", "tfe"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            config_of("ppo", {"framework": framework, "lr": 0.001})
            config_of("ppo", {"framework": framework})
        # (The other notes list RLlib's defaults applied: see the tests of rllib_defaults.)
        notes = [str(w.message) for w in caught if w.category is RLlibConfigNote and "framework=" in str(w.message)]
        assert len(notes) == 1 and f"framework={framework!r}" in notes[0] and "PyTorch" in notes[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config_of("ppo", {"framework": "torch"})
    assert not [w for w in caught if w.category is RLlibConfigNote and "framework=" in str(w.message)]
    with pytest.raises(ConfigError, match="framework='jax'"):
        config_of("ppo", {"framework": "jax"})


def test_keys_that_change_nothing_are_listed_in_one_note() -> None:
    rllib = {
        "log_level": "WARN",
        "enable_connectors": True,
        "horizon": None,
        "clip_rewards": False,
        "optimizer": {"debug": False},
        "model": {"use_attention": False, "fcnet_hiddens": [16]},
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = config_of("apex", rllib)
    notes = [str(w.message) for w in caught if w.category is RLlibConfigNote]
    assert len(notes) == 1
    for key in ("log_level", "enable_connectors", "horizon", "clip_rewards", "optimizer.debug", "model.use_attention"):
        assert key in notes[0]
    assert config.model == {"fcnet_hiddens": [16]}


@pytest.mark.parametrize(
    ("algo", "rllib", "named"),
    [
        ("ppo", {"horizon": 200}, "horizon=200"),
        ("ppo", {"clip_rewards": True}, "clip_rewards=True"),
        ("dqn", {"num_atoms": 51}, "num_atoms=51"),
        ("dqn", {"hiddens": [256]}, "hiddens=[256]"),
        ("impala", {"opt_type": "rmsprop"}, "opt_type='rmsprop'"),
        ("ppo", {"model": {"use_attention": True}}, "model.use_attention=True"),
        (
            "dqn",
            {"replay_buffer_config": {"type": "ReservoirReplayBuffer"}},
            "replay_buffer_config.type='ReservoirReplayBuffer'",
        ),
        ("dqn", {"exploration_fraction": 0.1}, "exploration_fraction=0.1"),
        ("ppo", {"multiagent": {"observation_fn": "my:fn"}}, "multiagent.observation_fn='my:fn'"),
    ],
)
def test_an_rllib_key_that_would_change_the_math_is_a_config_error_naming_it(
    algo: str, rllib: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        config_of(algo, {**rllib, "lr": -1.0})  # every problem at once: the RLlib key's and the others
    message = str(raised.value)
    assert f"RLlib key {named} is not implemented by flowrl" in message
    assert "lr=-1.0" in message


def test_rllib_lstm_keys_translate_to_the_recurrent_model() -> None:
    rllib = {"model": {"use_lstm": True, "lstm_cell_size": 32, "max_seq_len": 10, "lstm_use_prev_action_reward": True}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = config_of("ppo", rllib)
    assert config.model == {
        "use_lstm": True,
        "lstm_cell_size": 32,
        "max_seq_len": 10,
        "lstm_use_prev_action": True,
        "lstm_use_prev_reward": True,
    }
    assert any("lstm_use_prev_action_reward=True" in str(w.message) for w in caught)
    with pytest.raises(ConfigError, match="model.use_lstm=True: DQNConfig does not learn from sequences yet"):
        config_of("dqn", rllib)


def test_an_rllib_key_the_algorithm_lacks_or_a_contradiction_is_a_config_error() -> None:
    with pytest.raises(
        ConfigError, match="optimizer.num_replay_buffer_shards is num_replay_shards in flowrl, which DQNConfig"
    ):
        config_of("dqn", {"optimizer": {"num_replay_buffer_shards": 2}})
    with pytest.raises(
        ConfigError, match="buffer_size=1000 and replay_buffer_config.capacity=2000 both set buffer_size"
    ):
        config_of("dqn", {"buffer_size": 1000, "replay_buffer_config": {"capacity": 2000}})
    with pytest.raises(ConfigError, match="replay_buffer_config.capacity=2000 and buffer_size=1000 both set"):
        config_of("dqn", {"replay_buffer_config": {"capacity": 2000}, "buffer_size": 1000})
    config_of("dqn", {"buffer_size": 2000, "replay_buffer_config": {"capacity": 2000}})  # agreeing is fine
    with pytest.raises(ConfigError, match="RLlib key replay_buffer_config.capcity is not one flowrl reads"):
        config_of("dqn", {"replay_buffer_config": {"capcity": 2000}})


def test_rollout_fragment_length_auto_divides_the_batch_among_workers_and_envs() -> None:
    config = config_of(
        "a2c", {"rollout_fragment_length": "auto", "train_batch_size": 40, "num_workers": 0, "num_envs_per_worker": 1}
    )
    assert config.rollout_fragment_length == 40
    config = config_of(
        "ppo", {"rollout_fragment_length": "auto", "train_batch_size": 1000, "num_workers": 3, "num_envs_per_worker": 2}
    )
    assert config.rollout_fragment_length == 167  # 1000 / 6, rounded up


def test_a_partial_exploration_config_is_merged_into_rllibs_default_for_the_algorithm() -> None:
    td3 = config_of("td3", {"exploration_config": {"random_timesteps": 5000}})
    assert td3.exploration_config == {
        "type": "GaussianNoise",
        "random_timesteps": 5000,
        "stddev": 0.1,
        "initial_scale": 1.0,
        "final_scale": 1.0,
        "scale_timesteps": 1,
    }
    ddpg = config_of("ddpg", {"exploration_config": {"ou_sigma": 0.3}})
    assert ddpg.exploration_config["type"] == "OrnsteinUhlenbeckNoise" and ddpg.exploration_config["ou_sigma"] == 0.3
    dqn = config_of("dqn", {"exploration_config": {"epsilon_timesteps": 2000}})
    assert dqn.exploration_config == {
        "type": "EpsilonGreedy",
        "initial_epsilon": 1.0,
        "final_epsilon": 0.02,
        "epsilon_timesteps": 2000,
    }


def test_rllibs_multiagent_dict_becomes_flowrls_keys() -> None:
    def mapping(agent_id: str, episode: Any, worker: Any, **kwargs: Any) -> str:
        return "learner" if agent_id == "a" else "fixed"

    config = config_of(
        "ppo",
        {
            "multiagent": {
                "policies": ["learner", "fixed"],
                "policy_mapping_fn": mapping,
                "policies_to_train": ["learner"],
                "count_steps_by": "env_steps",
            }
        },
    )
    assert config.policies == {"learner": None, "fixed": None}
    assert config.policies_to_train == ["learner"]
    assert isinstance(config.policy_mapping_fn, RLlibPolicyMapping)
    assert config.policy_mapping_fn("a") == "learner" and config.policy_mapping_fn("b") == "fixed"
    spec = config_of("ppo", {"multiagent": {"policies": {"p": (None, None, None, {"lr": 0.01})}}})
    assert spec.policies == {"p": {"config": {"lr": 0.01}}}


def test_a_flowrl_config_reads_unchanged_and_without_notes() -> None:
    for name in ("ppo", "dqn", "ddpg", "td3", "apex", "es", "impala"):
        values = get_algorithm(name).config_class.from_dict({}).to_dict(jsonable=False)
        translation = translate(name, values)
        assert translation.values == values
        assert not translation.messages() and not translation.problems


def test_the_mapping_tables_are_disjoint_and_documented() -> None:
    tables = [set(RENAMED), set(NESTED), set(IGNORED), set(IGNORED_AT), set(NOT_IMPLEMENTED)]
    for i, a in enumerate(tables):
        for b in tables[i + 1 :]:
            assert not a & b
    page = (REPO / "docs" / "coming-from-rllib.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([\w.]+)`", page, flags=re.MULTILINE))
    keys = {
        *RENAMED,
        *IGNORED,
        *IGNORED_AT,
        *NOT_IMPLEMENTED,
        "framework",
        "evaluation_duration",
        "disable_env_checking",
        "replay_buffer_config.type",
        "rollout_fragment_length",
        "exploration_config",
        "observation_filter",
    }
    keys |= {f"{outer}.{inner}" for outer, inner_keys in NESTED.items() for inner in inner_keys}
    keys |= {f"{outer}.{inner}" for outer, inner_keys in NESTED_IGNORED.items() for inner in inner_keys}
    keys |= {f"model.{key}" for key in MODEL_IGNORED}
    assert keys - documented == set()


# Algorithms with an RLlib counterpart; ppo_dqn composes two of them and has no RLlib defaults of its own.
RLLIB_ALGORITHMS = [name for name in list_algorithms() if name != "ppo_dqn"]


def rllib_defaults_of(algo: str) -> dict[str, Any]:
    return dict(get_algorithm(algo).config_class.rllib_defaults)


def assert_takes(config: Any, defaults: dict[str, Any]) -> None:
    """``config`` has each of ``defaults`` (``model``: each of its keys; ``auto``: any length)."""
    for key, value in defaults.items():
        if key == "model":
            assert {sub: config.model.get(sub) for sub in value} == value
        elif value != "auto":
            assert getattr(config, key) == value, key


@pytest.mark.parametrize("algo", RLLIB_ALGORITHMS)
def test_each_algorithm_declares_rllibs_defaults_where_flowrls_differ(algo: str) -> None:
    cls = get_algorithm(algo).config_class
    assert "rllib_defaults" in vars(cls), f"{cls.__name__} must declare its own rllib_defaults"
    own = cls.from_dict({})
    for key, value in cls.rllib_defaults.items():
        if key == "model":
            model = {**DEFAULT_MODEL_CONFIG, **own.model}
            assert value and all(model[sub] != sub_value for sub, sub_value in value.items()), value
        else:
            assert getattr(own, key) != value, f"{key}={value!r} is flowrl's default already"


@pytest.mark.parametrize("algo", RLLIB_ALGORITHMS)
def test_an_rllib_config_takes_rllibs_defaults_and_a_flowrl_config_keeps_flowrls(algo: str) -> None:
    rllib = config_of(algo, {"framework": "torch"})
    assert_takes(rllib, rllib_defaults_of(algo))
    own = get_algorithm(algo).config_class()
    assert config_of(algo, {}).to_dict() == own.to_dict()  # no framework key: flowrl's defaults, untouched
    assert config_of(algo, {"num_workers": own.num_workers}).to_dict() == own.to_dict()


def test_rllibs_defaults_fill_only_the_keys_the_config_leaves_out() -> None:
    ppo = config_of("ppo", {"framework": "tf", "lambda": 0.9, "sgd_stepsize": 1e-3, "model": {"fcnet_hiddens": [32]}})
    assert (ppo.lambda_, ppo.lr, ppo.model) == (0.9, 1e-3, {"fcnet_hiddens": [32]})  # given, under any of RLlib's names
    assert (ppo.clip_param, ppo.num_sgd_iter, ppo.vf_loss_coeff) == (0.3, 30, 1.0)  # left out: RLlib's
    # RLlib merged a config's model into its model defaults key by key.
    a2c = config_of(
        "a2c", {"framework": "torch", "model": {"fcnet_hiddens": [32]}, "train_batch_size": 40, "num_workers": 0}
    )
    assert a2c.model == {"fcnet_hiddens": [32], "vf_share_layers": True}
    assert a2c.rollout_fragment_length == 40 and a2c.num_envs_per_worker == 1  # RLlib's 'auto', of the batch given
    custom = config_of("ppo", {"framework": "torch", "model": {"custom_model": "torch.nn:Identity"}})
    assert custom.model == {"custom_model": "torch.nn:Identity"}  # a custom model builds its own layers
    ddpg = config_of(
        "ddpg",
        {
            "framework": "torch",
            "exploration_config": {"ou_sigma": 0.3},
            "replay_buffer_config": {"type": "MultiAgentReplayBuffer", "capacity": 2000},
        },
    )
    assert (ddpg.prioritized_replay, ddpg.buffer_size, ddpg.tau, ddpg.gamma) == (False, 2000, 0.002, 0.99)
    assert ddpg.exploration_config["type"] == "OrnsteinUhlenbeckNoise" and ddpg.exploration_config["ou_sigma"] == 0.3
    apex = config_of("apex", {"framework": "tf", "num_workers": 3, "optimizer": {"num_replay_buffer_shards": 2}})
    assert (apex.num_workers, apex.num_replay_shards, apex.train_batch_size) == (3, 2, 512)


def test_the_tuned_examples_layout_alone_does_not_make_a_config_rllibs(tmp_path: Path) -> None:
    file = tmp_path / "ppo.yaml"
    layout = "cartpole-ppo:\n  run: PPO\n  env: CartPole-v1\n  config:\n"
    file.write_text(layout + "    num_workers: 1\n", encoding="utf-8")
    config = config_of("ppo", load_experiment_file(file)["config"])
    assert (config.lambda_, config.clip_param) == (0.95, 0.2)
    file.write_text(layout + "    framework: torch\n", encoding="utf-8")
    config = config_of("ppo", load_experiment_file(file)["config"])
    assert (config.lambda_, config.clip_param) == (1.0, 0.3)


def test_the_rllib_defaults_note_lists_what_was_applied_once() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):  # the CLI and the Trainer each read the config
            config_of(
                "ppo",
                {
                    "framework": "torch",
                    "lr": 3e-4,
                    "num_sgd_iter": 6,
                    "vf_loss_coeff": 0.01,
                    "model": {"fcnet_hiddens": [32]},
                },
            )
    notes = [str(w.message) for w in caught if w.category is RLlibConfigNote]
    assert notes == [
        "RLlib config (it has a framework key): the keys it leaves out take RLlib's defaults where "
        "flowrl's differ: lambda=1.0, clip_param=0.3"
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config_of("ppo", {"lambda": 1.0})  # a flowrl config: no note
        config_of(
            "ppo",
            {
                "framework": "torch",
                "lr": 5e-5,
                "num_sgd_iter": 30,
                "lambda": 1.0,
                "clip_param": 0.3,
                "vf_loss_coeff": 1.0,
                "model": {"fcnet_hiddens": [256, 256]},
            },
        )  # nothing left to apply
    assert not [w for w in caught if w.category is RLlibConfigNote]


def test_a_set_flag_on_an_rllib_file_keeps_rllibs_other_model_defaults() -> None:
    args = argparse.Namespace(set=["model.fcnet_hiddens=[64]"], num_workers=None, seed=None)
    config = build_config(get_algorithm("apex"), {"framework": "tf"}, args)
    assert config_of("apex", config).model == {"fcnet_hiddens": [64], "fcnet_activation": "tanh"}
    assert config_of("apex", build_config(get_algorithm("apex"), {}, args)).model["fcnet_activation"] == "relu"


def _doc_value(value: Any) -> str:
    """How the defaults table of docs/coming-from-rllib.md writes a value."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, dict):
        return f"{value['type']}, RLlib's options"
    return str(value)


def test_the_rllib_defaults_table_is_the_code() -> None:
    page = (REPO / "docs" / "coming-from-rllib.md").read_text(encoding="utf-8")
    documented: dict[str, dict[str, str]] = {}
    rows = re.findall(r"^\| ([^|]+?) \| `([\w.]+)` \| ([^|]+?) \| [^|]+ \|$", page, flags=re.MULTILINE)
    names = {"Ape-X DQN (`apex`)": "apex", "Ape-X DDPG (`apex_ddpg`)": "apex_ddpg"}
    for label, key, value in rows:
        algo = names.get(label, label.lower())
        if algo in RLLIB_ALGORITHMS:
            documented.setdefault(algo, {})[key] = value
    expected: dict[str, dict[str, str]] = {}
    for algo in RLLIB_ALGORITHMS:
        for key, value in rllib_defaults_of(algo).items():
            if key == "model":
                expected.setdefault(algo, {}).update({f"model.{sub}": _doc_value(v) for sub, v in value.items()})
            else:
                expected.setdefault(algo, {})["lambda" if key == "lambda_" else key] = _doc_value(value)
    assert documented == expected


@pytest.mark.parametrize("path", RLLIB_EXAMPLES, ids=lambda p: p.stem)
def test_rllibs_tuned_examples_are_valid_flowrl_configs(path: Path) -> None:
    experiment = load_experiment_file(path)
    assert experiment["algo"] and experiment["env"] and experiment["stop"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RLlibConfigNote)
        config = get_algorithm(experiment["algo"]).config_class.from_dict(experiment["config"])
    assert isinstance(config, TrainerConfig)


def test_rllib_examples_cover_the_algorithms_of_the_issue() -> None:
    algos = {load_experiment_file(path)["algo"].lower() for path in RLLIB_EXAMPLES}
    assert algos == {"ppo", "dqn", "apex", "a2c", "pg", "impala", "es", "ars", "ddpg", "td3"}


def test_flowrl_train_prints_each_note_once(
    tmp_path: Path, ray_session: None, capsys: pytest.CaptureFixture[str]
) -> None:
    warnings.simplefilter("always", RLlibConfigNote)  # as a command line shows them: once each, by flowrl itself
    file = tmp_path / "cartpole-pg.yaml"
    file.write_text(
        "cartpole-pg:\n  env: CartPole-v1\n  run: PG\n  stop: {training_iteration: 1}\n"
        "  config:\n    framework: tf\n    num_workers: 0\n    train_batch_size: 200\n"
        "    min_time_s_per_reporting: 0\n    log_level: WARN\n    log_sys_usage: true\n",
        encoding="utf-8",
    )
    assert main(["train", "--config", str(file), "--results-dir", str(tmp_path / "runs")]) == 0
    captured = capsys.readouterr()
    err = captured.err
    notes = [line for line in err.splitlines() if line.startswith("flowrl: note: ")]
    assert len(notes) == 4, captured
    assert sum("framework='tf'" in note for note in notes) == 1
    assert sum("min_time_s_per_reporting is min_iter_time_s here" in note for note in notes) == 1
    [defaults] = [note for note in notes if "RLlib's defaults" in note]
    assert "lr=0.0004" in defaults and "model.fcnet_hiddens=[256, 256]" in defaults
    assert "train_batch_size" not in defaults and "num_workers" not in defaults  # the file sets them
    [ignored] = [note for note in notes if "ignored here" in note]
    assert "log_level (logging)" in ignored and "log_sys_usage (logging)" in ignored
    [params] = (tmp_path / "runs").glob("*/params.json")
    config = json.loads(params.read_text())["config"]
    assert "framework" not in config and config["min_iter_time_s"] == 0
    assert config["lr"] == 0.0004 and config["train_batch_size"] == 200


def final_result(runs: Path) -> dict[str, Any]:
    [progress] = runs.glob("*/progress.jsonl")
    return json.loads(progress.read_text().splitlines()[-1])


@pytest.mark.learning
@pytest.mark.parametrize(("example", "flags"), [("cartpole-ppo", []), ("cartpole-dqn", ["--seed", "0"])])
def test_rllib_tuned_example_reaches_its_stop_reward(
    example: str, flags: list[str], tmp_path: Path, ray_session: None
) -> None:
    """The file runs as RLlib wrote it (MeanStdFilter, framework tf, RLlib's defaults for the keys it leaves
    out), within its own step budget. PPO runs exactly the file, unseeded: with RLlib's lambda and
    clip_param it reaches 150 in about 30k of its 100k steps. DQN keeps a fixed seed."""
    path = REPO / "tuned_examples" / "rllib" / f"{example}.yaml"
    stop_reward = load_experiment_file(path)["stop"]["episode_reward_mean"]
    status = main(
        ["train", "--config", str(path), *flags, "--results-dir", str(tmp_path), "--checkpoint-interval-s", "0"]
    )
    assert status == 0
    result = final_result(tmp_path)
    assert result["episode_reward_mean"] >= stop_reward, (
        f"{example}: {result['episode_reward_mean']} after {result['timesteps_total']} steps"
    )
