"""RLlib's R2D2 keys read as flowrl's r2d2 keys, each with one note; elsewhere they replay single steps or are
refused."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from flowrl.algorithms import get_algorithm
from flowrl.config import rllib as rllib_compat
from flowrl.config.rllib import RLlibConfigNote
from flowrl.errors import ConfigError

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test sees the notes as a new process would (they are shown once per process)."""
    monkeypatch.setattr(rllib_compat, "_shown", set())
    yield


def read(algo: str, values: dict[str, Any]) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = get_algorithm(algo).config_class.from_dict(values)
    return config, [str(w.message) for w in caught if w.category is RLlibConfigNote]


def test_rllib_2s_nested_sequence_keys_are_r2d2s_with_one_note_each() -> None:
    rllib = {"replay_sequence_length": 12, "replay_burn_in": 4, "storage_unit": "sequences"}
    config, notes = read("r2d2", {"replay_buffer_config": rllib})
    assert (config.replay_sequence_length, config.replay_burn_in) == (12, 4)
    assert "RLlib key replay_buffer_config.replay_sequence_length is replay_sequence_length here" in notes
    assert "RLlib key replay_buffer_config.replay_burn_in is replay_burn_in here" in notes
    [ignored] = [note for note in notes if note.startswith("RLlib keys ignored")]
    assert "replay_buffer_config.storage_unit (R2D2's replay stores sequences)" in ignored
    # The burn-in is inside flowrl's sequences, before RLlib's: the note says which steps are not learned.
    assert any(
        "flowrl's replay_burn_in=4 is the first 4 steps of each sequence: a sequence that starts its episode is "
        "learned whole, but the first 4 steps of a sampled fragment that continues an episode are not learned" in note
        for note in notes
    ), notes
    assert len(notes) == 4, notes
    with pytest.raises(ConfigError, match=r"storage_unit='episodes' is not implemented.*stores only 'sequences'"):
        read("r2d2", {"replay_buffer_config": {"storage_unit": "episodes"}})


def test_rllib_1s_burn_in_and_computed_length_are_max_seq_len_plus_burn_in() -> None:
    config, notes = read("r2d2", {"burn_in": 4, "replay_sequence_length": -1, "model": {"max_seq_len": 10}})
    assert (config.replay_sequence_length, config.replay_burn_in) == (14, 4)
    assert "RLlib key burn_in is replay_burn_in here" in notes
    assert any("replay_sequence_length=14 here (model.max_seq_len=10 + replay_burn_in=4)" in n for n in notes)
    # An RLlib config (framework) with a burn-in but no length: RLlib's default max_seq_len of 20 after it.
    config, notes = read("r2d2", {"framework": "torch", "burn_in": 5})
    assert config.replay_sequence_length == 25 and not config.zero_init_states
    assert any(
        "zero_init_states" in note and "RLlib's R2D2 started replayed sequences from zeros" in note for note in notes
    )
    # flowrl's own length is kept, and RLlib's zero_init_states is flowrl's key (no note when given).
    config, notes = read("r2d2", {"framework": "torch", "replay_sequence_length": 8, "zero_init_states": True})
    assert config.replay_sequence_length == 8 and config.zero_init_states and not notes
    with pytest.raises(
        ConfigError, match="burn_in=1 and replay_buffer_config.replay_burn_in=2 both set replay_burn_in"
    ):
        read("r2d2", {"burn_in": 1, "replay_buffer_config": {"replay_burn_in": 2}})


def test_other_algorithms_ignore_the_sequence_keys_at_single_steps_and_refuse_sequences() -> None:
    _, notes = read("dqn", {"burn_in": 0, "replay_buffer_config": {"replay_burn_in": 0, "replay_sequence_length": 1}})
    assert any("burn_in (no burn-in)" in note and "replay_buffer_config.replay_burn_in" in note for note in notes)
    with pytest.raises(ConfigError) as raised:
        read(
            "apex", {"burn_in": 3, "replay_buffer_config": {"storage_unit": "sequences", "replay_sequence_length": 20}}
        )
    message = str(raised.value)
    assert "RLlib key burn_in=3 is not implemented" in message
    assert (
        "storage_unit='sequences' is not implemented by flowrl (in RLlib it stores sequences or episodes; flowrl's r2d2"
        in message
    )
    assert (
        "replay_sequence_length=20 is not implemented by flowrl (in RLlib it replays sequences, as flowrl's r2d2"
        in message
    )


def test_rllib_2s_tuned_example_zero_init_states_in_the_replay_buffer_config_is_r2d2s() -> None:
    """RLlib's stateless-cartpole-r2d2 example writes zero_init_states inside replay_buffer_config, and its
    replay buffer reads replay_zero_init_states there: both are R2D2's zero_init_states."""
    for name in ("zero_init_states", "replay_zero_init_states"):
        for value in (True, False):
            rllib_compat._shown.clear()  # each read shows its notes, as in a new process
            rllib = {"storage_unit": "sequences", "replay_burn_in": 20, name: value}
            config, notes = read("r2d2", {"framework": "torch", "replay_buffer_config": rllib})
            assert config.zero_init_states is value
            assert f"RLlib key replay_buffer_config.{name} is zero_init_states here" in notes
            # Given, so the note about RLlib's zero start state is not shown.
            assert not any("set zero_init_states: true for RLlib's" in note for note in notes), notes
    with pytest.raises(ConfigError, match="zero_init_states=False and replay_buffer_config.zero_init_states=True"):
        read("r2d2", {"zero_init_states": False, "replay_buffer_config": {"zero_init_states": True}})
    # Single steps carry no recurrent state: DQN ignores both.
    config, notes = read("dqn", {"replay_buffer_config": {"zero_init_states": True, "replay_zero_init_states": False}})
    [ignored] = [note for note in notes if note.startswith("RLlib keys ignored")]
    assert "replay_buffer_config.zero_init_states (a replayed single step" in ignored
    assert "replay_buffer_config.replay_zero_init_states (a replayed single step" in ignored
