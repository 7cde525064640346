"""TrainerConfig: every problem reported at once, each naming the key, the value and what is valid."""

from __future__ import annotations

import dataclasses
import json
import pickle
import warnings
from dataclasses import dataclass
from typing import Any, Literal, cast

import pytest

from flowrl.config import TrainerConfig, cfg_field
from flowrl.errors import ConfigError, FlowRLError, FrozenConfigError

pytestmark = pytest.mark.unit


@dataclass(kw_only=True)
class PPOLikeConfig(TrainerConfig):
    """An algorithm config as algorithms write them: new keys, a changed default, a cross-field check."""

    sgd_minibatch_size: int = cfg_field(128, "Minibatch size (steps) for each SGD step.", min=1)
    num_sgd_iter: int = cfg_field(30, "SGD passes over each train batch.", min=1)
    train_batch_size: int = cfg_field(512, "Steps per training batch (this algorithm's default).", min=1)
    vf_loss: Literal["mse", "huber"] = cfg_field("mse", "Value-function loss.")
    lr_schedule: list[Any] | None = cfg_field(None, "[[timestep, lr], ...] pieces; None: constant lr.")

    def check(self) -> list[str]:
        problems = super().check()
        if self.sgd_minibatch_size > self.train_batch_size:
            problems.append(f"sgd_minibatch_size={self.sgd_minibatch_size} > train_batch_size={self.train_batch_size}")
        return problems


def problems_of(values: dict[str, Any], cls: type[TrainerConfig] = TrainerConfig) -> list[str]:
    with pytest.raises(ConfigError) as info:
        cls.from_dict(values)
    return info.value.problems


# --- defaults and unknown keys ---


def test_defaults_are_valid_and_use_rllib_names() -> None:
    config = TrainerConfig.from_dict(None)
    assert config == TrainerConfig.from_dict({}) == TrainerConfig()
    assert (config.num_workers, config.num_envs_per_worker, config.rollout_fragment_length) == (2, 1, 200)
    assert (config.batch_mode, config.train_batch_size, config.lr, config.gamma) == (
        "truncate_episodes",
        4000,
        5e-4,
        0.99,
    )
    assert config.seed is None and config.grad_clip is None and config.model == {} and config.explore is True
    assert isinstance(config.num_gpus, float) and isinstance(config.min_iter_time_s, float)


def test_unknown_key_suggests_closest_name_case_insensitively() -> None:
    assert problems_of({"lrr": 1e-3}) == ["unknown config key 'lrr'; did you mean 'lr'?"]
    assert problems_of({"Train_Batch_Size": 10}) == [
        "unknown config key 'Train_Batch_Size'; did you mean 'train_batch_size'?"
    ]
    assert problems_of({"num_worker": 1}) == ["unknown config key 'num_worker'; did you mean 'num_workers'?"]
    # A part of a long name finds it too.
    assert problems_of({"num_envs": 4}) == ["unknown config key 'num_envs'; did you mean 'num_envs_per_worker'?"]


def test_unknown_key_with_nothing_close_lists_valid_keys() -> None:
    [problem] = problems_of({"xyzzy": 1})
    assert problem.startswith("unknown config key 'xyzzy'; valid keys include 'num_workers', 'num_envs_per_worker'")
    assert f"lists all {len(dataclasses.fields(TrainerConfig))}" in problem
    # RLlib's framework key is read (every framework runs on PyTorch); a value RLlib never had is named.
    assert problems_of({"framework": "jax"}) == [
        "RLlib key framework='jax' must be one of 'torch', 'tf', 'tf2', 'tfe' "
        "(flowrl runs every one of them on PyTorch)"
    ]


def test_every_problem_is_reported_in_one_error() -> None:
    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_dict({"lrr": 1, "gamma": 1.5, "lr": "fast", "batch_mode": "whole", "num_workers": -1})
    error = info.value
    assert error.problems == [
        "unknown config key 'lrr'; did you mean 'lr'?",
        "num_workers=-1 must be >= 0",
        "batch_mode='whole' must be one of 'truncate_episodes', 'complete_episodes'",
        "lr='fast' must be a float, got str",
        "gamma=1.5 must be <= 1",
    ]
    message = str(error)
    assert message.startswith("invalid config (5 problems):\n")
    assert all(f"\n  - {problem}" in message for problem in error.problems)
    assert isinstance(error, FlowRLError)


def test_config_error_singular_and_pickles() -> None:
    error = ConfigError(["gamma=1.5 must be <= 1"])
    assert str(error) == "invalid config (1 problem):\n  - gamma=1.5 must be <= 1"
    copy = pickle.loads(pickle.dumps(error))
    assert copy.problems == error.problems and str(copy) == str(error)


def test_values_must_be_a_mapping() -> None:
    assert problems_of(cast(Any, [("lr", 1)])) == ["config must be a mapping of key to value, got list"]


# --- type rules ---


def test_wrong_types_name_expected_and_seen_types() -> None:
    assert problems_of({"lr": "fast"}) == ["lr='fast' must be a float, got str"]
    assert problems_of({"num_workers": 2.5}) == ["num_workers=2.5 must be an int, got float"]
    assert problems_of({"explore": 1}) == ["explore=1 must be a bool, got int"]
    assert problems_of({"model": [64, 64]}) == ["model=[64, 64] must be a dict, got list"]
    assert problems_of({"batch_mode": 3}) == ["batch_mode=3 must be one of 'truncate_episodes', 'complete_episodes'"]


def test_strings_are_not_parsed_as_numbers() -> None:
    # The CLI converts "--set lr=1e-3"; the config itself never guesses.
    assert problems_of({"lr": "1e-3", "train_batch_size": "64"}) == [
        "train_batch_size='64' must be an int, got str",
        "lr='1e-3' must be a float, got str",
    ]


def test_bools_are_not_numbers() -> None:
    assert problems_of({"num_workers": True, "lr": False, "num_gpus": True}) == [
        "num_workers=True must be an int, got bool",
        "lr=False must be a float, got bool",
        "num_gpus=True must be a float, got bool",
    ]


def test_ints_are_converted_for_float_fields() -> None:
    config = TrainerConfig.from_dict({"lr": 1, "gamma": 1, "num_gpus": 0, "grad_clip": 40})
    assert (config.lr, config.gamma, config.num_gpus, config.grad_clip) == (1.0, 1.0, 0.0, 40.0)
    assert all(type(v) is float for v in (config.lr, config.gamma, config.num_gpus, config.grad_clip))
    assert type(TrainerConfig.from_dict({"num_workers": 3}).num_workers) is int


def test_optional_fields_accept_none_and_others_do_not() -> None:
    config = TrainerConfig.from_dict({"seed": None, "grad_clip": None})
    assert config.seed is None and config.grad_clip is None
    assert TrainerConfig.from_dict({"seed": 7}).seed == 7
    assert problems_of({"seed": "7", "lr": None, "grad_clip": "x"}) == [
        "lr=None must be a float, got None",
        "grad_clip='x' must be a float or None, got str",
        "seed='7' must be an int or None, got str",
    ]


# --- ranges and choices ---


def test_ranges_name_the_bound() -> None:
    assert problems_of({"gamma": 1.5}) == ["gamma=1.5 must be <= 1"]
    assert problems_of({"gamma": -0.1}) == ["gamma=-0.1 must be >= 0"]
    assert problems_of({"lr": 0}) == ["lr=0 must be > 0"]
    assert problems_of({"grad_clip": 0.0}) == ["grad_clip=0.0 must be > 0"]
    assert problems_of({"num_envs_per_worker": 0, "rollout_fragment_length": -5}) == [
        "num_envs_per_worker=0 must be >= 1",
        "rollout_fragment_length=-5 must be >= 1",
    ]
    assert problems_of({"lr": float("nan")}) == ["lr=nan must be > 0"]
    # The bounds themselves are valid.
    config = TrainerConfig.from_dict({"gamma": 0, "num_workers": 0, "min_iter_time_s": 0})
    assert (config.gamma, config.num_workers) == (0.0, 0)


def test_choices() -> None:
    assert TrainerConfig.from_dict({"batch_mode": "complete_episodes"}).batch_mode == "complete_episodes"
    assert problems_of({"batch_mode": "whole"}) == [
        "batch_mode='whole' must be one of 'truncate_episodes', 'complete_episodes'"
    ]
    assert problems_of({"vf_loss": "l1"}, PPOLikeConfig) == ["vf_loss='l1' must be one of 'mse', 'huber'"]

    @dataclass(kw_only=True)
    class WithChoices(TrainerConfig):
        optimizer: str = cfg_field("adam", "Optimizer name.", choices=["adam", "sgd"])

    assert WithChoices.from_dict({"optimizer": "sgd"}).optimizer == "sgd"
    assert problems_of({"optimizer": "rmsprop"}, WithChoices) == ["optimizer='rmsprop' must be one of 'adam', 'sgd'"]


# --- dict-valued keys ---


def test_model_keys_are_checked_against_default_model_config() -> None:
    config = TrainerConfig.from_dict({"model": {"fcnet_hiddens": [32], "fcnet_activation": "relu"}})
    assert config.model == {"fcnet_hiddens": [32], "fcnet_activation": "relu"}
    assert problems_of({"model": {"fcnet_hidden": [32]}}) == [
        "unknown model key 'fcnet_hidden'; did you mean 'fcnet_hiddens'?"
    ]
    [problem] = problems_of({"model": {"zzz": 1}})
    assert problem.startswith("unknown model key 'zzz'; valid model keys are 'fcnet_hiddens', 'fcnet_activation'")
    [problem] = problems_of({"model": {"fcnet_activation": "sigmoidish"}})
    assert "fcnet_activation='sigmoidish'" in problem and "'tanh'" in problem


def test_exploration_type_and_options_are_checked() -> None:
    config = TrainerConfig.from_dict({"exploration_config": {"type": "EpsilonGreedy", "initial_epsilon": 0.5}})
    assert config.exploration_config["initial_epsilon"] == 0.5
    [problem] = problems_of({"exploration_config": {"type": "EpsilonGreed"}})
    assert problem.startswith(
        "exploration_config['type']='EpsilonGreed' is not a known exploration; did you mean 'EpsilonGreedy'"
    )
    assert "(known: 'EpsilonGreedy', 'GaussianNoise', " in problem
    [problem] = problems_of({"exploration_config": {"type": "EpsilonGreedy", "epsilon_timestep": 10}})
    assert problem.startswith(
        "exploration_config option 'epsilon_timestep' is not an option of EpsilonGreedy; "
        "did you mean 'epsilon_timesteps'"
    )
    assert problems_of({"exploration_config": {"type": "StochasticSampling", "epsilon": 0.1}}) == [
        "exploration_config option 'epsilon' is not an option of StochasticSampling; it takes 'random_timesteps'"
    ]


# --- algorithm configs ---


def test_subclass_cross_field_check_shows_the_arithmetic() -> None:
    assert problems_of({"sgd_minibatch_size": 512, "train_batch_size": 256}, PPOLikeConfig) == [
        "sgd_minibatch_size=512 > train_batch_size=256"
    ]
    # Cross-field problems come in the same error as unknown keys.
    assert problems_of({"sgd_minibatch_sise": 1, "sgd_minibatch_size": 600}, PPOLikeConfig) == [
        "unknown config key 'sgd_minibatch_sise'; did you mean 'sgd_minibatch_size'?",
        "sgd_minibatch_size=600 > train_batch_size=512",
    ]


def test_cross_field_checks_wait_for_valid_values() -> None:
    # Comparing against a value the user did not give would make the arithmetic wrong.
    assert problems_of({"sgd_minibatch_size": 600, "train_batch_size": "big"}, PPOLikeConfig) == [
        "train_batch_size='big' must be an int, got str"
    ]


def test_subclass_overrides_a_base_default_and_adds_keys() -> None:
    config = PPOLikeConfig()
    assert config.train_batch_size == 512 and TrainerConfig().train_batch_size == 4000
    assert config.lr_schedule is None and config.vf_loss == "mse"
    names = [f.name for f in dataclasses.fields(PPOLikeConfig)]
    assert names[: len(dataclasses.fields(TrainerConfig))] == [f.name for f in dataclasses.fields(TrainerConfig)]
    assert PPOLikeConfig.from_dict({"lr_schedule": [[0, 1e-3], [1000, 1e-4]]}).lr_schedule == [[0, 1e-3], [1000, 1e-4]]
    assert problems_of({"lr_schedule": 0.1}, PPOLikeConfig) == ["lr_schedule=0.1 must be a list or None, got float"]


def test_a_field_without_cfg_field_or_with_a_bad_default_is_a_bug() -> None:
    @dataclass(kw_only=True)
    class Undocumented(TrainerConfig):
        secret: int = 3

    with pytest.raises(TypeError, match=r"Undocumented.secret must be declared with cfg_field"):
        Undocumented()
    with pytest.raises(TypeError, match="non-empty doc"):
        cfg_field(1, "  ")

    @dataclass(kw_only=True)
    class BadDefault(TrainerConfig):
        sgd_minibatch_size: int = cfg_field(0, "Minibatch size.", min=1)

    expected = r"BadDefault.sgd_minibatch_size has an invalid default: sgd_minibatch_size=0 must be >= 1"
    with pytest.raises(TypeError, match=expected):
        BadDefault.describe()


# --- round trips, replace, validate ---


def test_to_dict_from_dict_round_trip_through_json() -> None:
    config = PPOLikeConfig.from_dict(
        {
            "seed": 3,
            "lr": 1e-3,
            "model": {"fcnet_hiddens": [16, 16]},
            "env_config": {"size": 4},
            "sgd_minibatch_size": 64,
        }
    )
    data = json.loads(json.dumps(config.to_dict()))
    assert set(data) == {f.name for f in dataclasses.fields(PPOLikeConfig)}
    assert PPOLikeConfig.from_dict(data) == config
    # Tuples become lists, so a saved params.json reads back the same.
    assert TrainerConfig.from_dict({"model": {"conv_filters": [(16, 4, 2)]}}).to_dict()["model"] == {
        "conv_filters": [[16, 4, 2]]
    }


def test_replace_validates_and_keeps_the_class() -> None:
    config = PPOLikeConfig(seed=1)
    changed = config.replace(lr=1)
    assert type(changed) is PPOLikeConfig and changed.lr == 1.0 and changed.seed == 1 and config.lr == 5e-4
    with pytest.raises(ConfigError) as info:
        config.replace(train_batch_size=64, gama=0.9)
    assert info.value.problems == [
        "unknown config key 'gama'; did you mean 'gamma'?",
        "sgd_minibatch_size=128 > train_batch_size=64",
    ]


def test_validate_rechecks_assigned_values_and_construction_validates() -> None:
    config = PPOLikeConfig()
    config.gamma = 2
    config.sgd_minibatch_size = 1024
    with pytest.raises(ConfigError) as info:
        config.validate()
    assert info.value.problems == ["gamma=2 must be <= 1"]  # the cross-field check waits for valid values
    config.gamma = 1
    with pytest.raises(ConfigError) as info:
        config.validate()
    assert info.value.problems == ["sgd_minibatch_size=1024 > train_batch_size=512"]
    config.sgd_minibatch_size = 64
    config.validate()
    assert type(config.gamma) is float
    with pytest.raises(ConfigError, match=r"lr=-1 must be > 0"):
        TrainerConfig(lr=-1)


def test_dict_values_are_not_shared() -> None:
    a, b = TrainerConfig(), TrainerConfig()
    a.model["fcnet_hiddens"] = [8]
    a.env_config["x"] = 1
    assert b.model == {} and b.env_config == {} and TrainerConfig().model == {}
    env_config = {"size": 3}
    config = TrainerConfig.from_dict({"env_config": env_config})
    env_config["size"] = 4
    assert config.env_config == {"size": 3}


def test_num_gpus_without_cuda_is_a_warning_not_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = TrainerConfig.from_dict({"num_gpus": 1})
    assert config.num_gpus == 1.0
    assert any("num_gpus=1.0 but CUDA is not available" in str(w.message) for w in caught)


# --- docs and views ---


def test_every_field_has_a_doc() -> None:
    for cls in (TrainerConfig, PPOLikeConfig):
        for f in dataclasses.fields(cls):
            assert f.metadata["flowrl"].doc.strip(), f"{cls.__name__}.{f.name} has no doc"


def test_describe_lists_every_field_with_type_default_and_doc() -> None:
    text = PPOLikeConfig.describe()
    assert text.splitlines()[0].split() == ["key", "type", "default", "valid", "doc"]
    for f in dataclasses.fields(PPOLikeConfig):
        row = next(line for line in text.splitlines() if line.startswith(f.name + " "))
        first_words = " ".join(f.metadata["flowrl"].doc.split()[:3])
        assert first_words in row, f"{f.name}: {row!r}"
    lr_row = next(line for line in text.splitlines() if line.startswith("lr "))
    assert lr_row.split()[:4] == ["lr", "float", "0.0005", ">"]
    assert "'truncate_episodes' | 'complete_episodes'" in text
    assert "float | None" in text and "int | None" in text
    assert "Steps per training batch (this algorithm's default)." in " ".join(text.split())


def test_workers_and_policies_get_a_frozen_copy_with_the_keys_their_readers_use() -> None:
    config = TrainerConfig.from_dict(
        {"seed": 5, "env_config": {"size": 3}, "lr": 1e-3, "model": {"fcnet_hiddens": [8]}}
    )
    frozen = config.frozen()
    assert frozen.seed == 5 and frozen.env_config == {"size": 3}
    frozen.env_config["size"] = 99  # a copy: workers cannot change the config
    assert config.env_config == {"size": 3}
    with pytest.raises(FrozenConfigError, match="TrainerConfig is frozen"):
        frozen.seed = 6
    assert frozen.replace(seed=6).seed == 6 and frozen.replace(seed=6).is_frozen and not config.is_frozen
    assert TrainerConfig.per_policy_keys() == {
        "lr",
        "lr_schedule",
        "entropy_coeff_schedule",
        "model",
        "grad_clip",
        "explore",
        "exploration_config",
        "num_gpus",
        "seed",
        "gamma",
        "max_consecutive_nonfinite_updates",
    }
    assert frozen.lr == 1e-3 and frozen.model == {"fcnet_hiddens": [8]}


def test_defaults_change_an_inherited_default_and_keep_its_type_doc_and_bounds() -> None:
    @dataclasses.dataclass(kw_only=True)
    class Child(TrainerConfig):
        defaults = {"lr": 0.1, "model": {"fcnet_hiddens": [3]}}

    base = {f.name: f for f in dataclasses.fields(TrainerConfig)}
    child = {f.name: f for f in dataclasses.fields(Child)}
    assert Child().lr == 0.1 and Child().model == {"fcnet_hiddens": [3]} and TrainerConfig().lr == 5e-4
    assert list(child) == list(base)  # redefined in place: the order of the keys does not change
    assert child["lr"].metadata["flowrl"] == base["lr"].metadata["flowrl"]
    with pytest.raises(ConfigError, match="lr=-1 must be > 0"):
        Child.from_dict({"lr": -1})
    Child().model["fcnet_hiddens"].append(4)
    assert Child().model == {"fcnet_hiddens": [3]}  # each config gets its own copy of a dict default


@pytest.mark.parametrize(
    ("defaults", "message"),
    [
        ({"lrr": 0.1}, "Bad.defaults names 'lrr', which no base config declares"),
        ({"lr": -1.0}, r"Bad.defaults\['lr'\] is invalid: lr=-1.0 must be > 0"),
        ({"gamma": "high"}, r"Bad.defaults\['gamma'\] is invalid: gamma='high' must be a float"),
    ],
)
def test_a_bad_defaults_entry_fails_when_the_class_is_defined(defaults: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        type("Bad", (TrainerConfig,), {"defaults": defaults})


def test_a_key_in_defaults_and_in_the_class_body_is_refused() -> None:
    with pytest.raises(TypeError, match="Twice.lr is declared in the class body and in defaults"):
        type(
            "Twice",
            (TrainerConfig,),
            {"defaults": {"lr": 0.1}, "__annotations__": {"lr": float}, "lr": cfg_field(0.1, "lr")},
        )


def test_a_config_class_shipped_by_value_still_validates() -> None:
    """cloudpickle copies a class defined in a script, notebook or function by value, sentinels included."""
    import cloudpickle

    def define() -> type[TrainerConfig]:
        @dataclasses.dataclass(kw_only=True)
        class Local(TrainerConfig):
            defaults = {"lr": 0.1}

            hidden: list[int] = cfg_field([8], "Hidden sizes.")

        return Local

    shipped = cloudpickle.loads(cloudpickle.dumps(define()))
    config = shipped.from_dict({"seed": 1}).frozen()
    assert config.replace(seed=2).seed == 2 and config.lr == 0.1 and config.hidden == [8]
