"""Env creation (flowrl names, Gymnasium ids, creator functions), env checks, Atari preprocessing,
and the multi-agent env API (PettingZoo's Parallel API) with built-in multi-agent envs, PettingZoo's
turn-based (AEC) envs wrapped for it (:mod:`flowrl.envs.turn_based`), games against a random player
(:mod:`flowrl.envs.matches`); the built-in
``MaskedCartPole-v1`` (action masks, :mod:`flowrl.envs.masked`), ``StatelessCartPole-v1`` and ``TMaze-v0``
(tasks that need memory, :mod:`flowrl.envs.memory`) are registered with Gymnasium on import.

See :mod:`flowrl.envs.registry` for how names resolve and how creators reach Ray actors,
:mod:`flowrl.envs.multi_agent` for the multi-agent API, :mod:`flowrl.envs.multi_agent_checker` for
its checker and :mod:`flowrl.envs.multi_agent_envs` for the built-in multi-agent envs.
"""

from flowrl.envs.atari import is_atari_id, make_atari_env
from flowrl.envs.checker import check_env
from flowrl.envs.context import EnvContext
from flowrl.envs.masked import MaskedCartPole
from flowrl.envs.matches import MatchResult, play_against_random
from flowrl.envs.memory import StatelessCartPole, TMaze
from flowrl.envs.multi_agent import MultiAgentEnv, acting_agents, is_multi_agent_env, seed_action_spaces
from flowrl.envs.multi_agent_checker import check_multi_agent_env
from flowrl.envs.multi_agent_envs import CooperativeMatching, MultiAgentCartPole
from flowrl.envs.registry import env_spaces, get_env_creator, make_env, multi_agent_env_spaces, register_env
from flowrl.envs.testing import (
    FaultCounter,
    FaultInjectEnv,
    InjectedFault,
    fault_counter,
    faults_fired,
    release_fault_counters,
    remove_fault_counter,
)
from flowrl.envs.turn_based import TicTacToe, TurnBasedEnv

__all__ = [
    "CooperativeMatching",
    "EnvContext",
    "FaultCounter",
    "FaultInjectEnv",
    "InjectedFault",
    "MaskedCartPole",
    "MatchResult",
    "MultiAgentCartPole",
    "MultiAgentEnv",
    "StatelessCartPole",
    "TMaze",
    "TicTacToe",
    "TurnBasedEnv",
    "acting_agents",
    "check_env",
    "check_multi_agent_env",
    "env_spaces",
    "fault_counter",
    "faults_fired",
    "get_env_creator",
    "is_atari_id",
    "is_multi_agent_env",
    "make_atari_env",
    "make_env",
    "multi_agent_env_spaces",
    "play_against_random",
    "register_env",
    "release_fault_counters",
    "remove_fault_counter",
    "seed_action_spaces",
]
