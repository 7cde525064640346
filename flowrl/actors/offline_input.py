"""Opening a run's offline ``input``: the files found and checked against the run before any training.

A dataset that cannot serve the run fails here, with the reason: a missing or empty source, files that
are not experiences, spaces that differ from the env's, columns the algorithm needs that the data lacks,
multi-agent experiences given to a single-agent run (and the reverse).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from flowrl.actors.learner_group import learner_group
from flowrl.actors.placeholders import placeholders_active
from flowrl.actors.resources import PlanResources
from flowrl.config.data_keys import MINARI_PREFIX, SAMPLER
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.data.offline import OfflineData
from flowrl.envs.spaces import space_to_json
from flowrl.errors import CheckpointError, ConfigError, OfflineDataError

if TYPE_CHECKING:
    from flowrl.actors.worker_set import WorkerSet
    from flowrl.config import TrainerConfig
    from flowrl.policy import PolicySpec


def offline_sources(config: TrainerConfig) -> list[Any]:
    """The sources of ``config.input`` that are experiences on disk (a list counts as one source)."""
    value = config.input
    if isinstance(value, dict):
        return [source for source in value if source != SAMPLER]
    return [] if value == SAMPLER else [value]


def open_input(
    source: Any,
    policy_specs: Mapping[str, PolicySpec],
    *,
    columns: Sequence[str],
    why: str,
) -> OfflineData:
    """``source``'s experiences, checked against the run's policies: their spaces (when the data's
    ``metadata.json`` records them), single- against multi-agent, and the ``columns`` the algorithm
    needs (``why`` says what for). Raises :class:`~flowrl.errors.OfflineDataError`."""
    if isinstance(source, str) and source.startswith(MINARI_PREFIX):
        from flowrl.actors.minari_input import minari_files  # imported here: the minari extra is optional

        source = minari_files(source)
    data = OfflineData(source)
    multi_agent_data = SampleBatch.POLICY_ID in data.schema.names
    multi_agent_run = set(policy_specs) != {DEFAULT_POLICY_ID}
    if multi_agent_data and not multi_agent_run:
        raise OfflineDataError(
            f"input {data.describe()!r} holds multi-agent experiences (a policy_id column), but this run trains "
            "a single-agent env; use experiences of a single-agent env, or a multi-agent env with policies"
        )
    if multi_agent_run:
        raise OfflineDataError(
            f"input {data.describe()!r}: learning from experiences trains single-agent envs only so far; this "
            f"run has the policies {sorted(policy_specs)}"
        )
    data.require(columns, why)
    _check_spaces(data, policy_specs[DEFAULT_POLICY_ID])
    return data


def offline_resources(
    workers: WorkerSet, config: TrainerConfig, *, algorithm: str, columns: Sequence[str], why: str
) -> PlanResources:
    """The resources of an offline plan: ``input``'s experiences, opened and checked against the run
    (:func:`open_input`), and the learner group the config asks for. A plan built for its graph
    (``flowrl plan --algo ALGORITHM``) opens nothing; a real run without experiences raises."""
    sources = offline_sources(config)
    if not sources:
        if placeholders_active():
            return PlanResources(learners=learner_group(workers, config))
        raise ConfigError(
            [
                f"{algorithm} learns from recorded experiences: set input to a directory, .parquet "
                "file, glob or list of them (written by output: DIR or flowrl record), not 'sampler'"
            ]
        )
    data = open_input(sources[0], workers.policy_specs, columns=columns, why=why)
    return PlanResources(offline=data, learners=learner_group(workers, config))


def _check_spaces(data: OfflineData, spec: PolicySpec) -> None:
    """The data's recorded spaces (``metadata.json``), or else its observation column's shape, against the policy's."""
    recorded = ((data.metadata or {}).get("policies") or {}).get(DEFAULT_POLICY_ID)
    for kind, space in (("observation_space", spec.observation_space), ("action_space", spec.action_space)):
        try:
            expected = space_to_json(space, kind)
        except CheckpointError:
            continue  # a space JSON cannot describe: the shapes below still guard the rows
        if recorded is not None and kind in recorded and recorded[kind] != expected:
            raise OfflineDataError(
                f"input {data.describe()!r} was recorded with the {kind} {recorded[kind]}, but this run's env has "
                f"{expected}: use experiences of the same env (and the same wrappers)"
            )
    shape = getattr(spec.observation_space, "shape", None)
    if SampleBatch.OBS in data.columns and shape is not None:
        found = data.columns[SampleBatch.OBS][0]
        if tuple(found) != tuple(shape):
            raise OfflineDataError(
                f"input {data.describe()!r}: its observations have the shape {tuple(found)}, but this run's "
                f"observation space has {tuple(shape)}: use experiences of the same env"
            )


#: The columns replaying recorded rows needs (what off-policy losses read).
REPLAY_COLUMNS = (
    SampleBatch.OBS,
    SampleBatch.ACTIONS,
    SampleBatch.REWARDS,
    SampleBatch.NEW_OBS,
    SampleBatch.TERMINATEDS,
)


def mixed_input(policy_specs: Mapping[str, PolicySpec], config: TrainerConfig) -> OfflineData | None:
    """The recorded source of an ``input`` that mixes it with the sampler (``{"sampler": f, DIR: 1 - f}``),
    opened and checked; None when ``input`` is the sampler alone."""
    sources = offline_sources(config)
    if not sources:
        return None
    if not isinstance(config.input, dict) or SAMPLER not in config.input or len(sources) > 1:
        raise OfflineDataError(
            f"input={config.input!r}: this algorithm samples its envs; it mixes them with one source of recorded "
            "experiences, as {'sampler': 0.5, 'data/': 0.5}"
        )
    return open_input(sources[0], policy_specs, columns=REPLAY_COLUMNS, why="replayed transitions need them")
