"""The RL loop of examples/rl_loop.py on a real server: the policy learns only
when the trainer's weights reach the server.

One TP 1 server serves both runs: first the control, which trains the same
way but never syncs (the server keeps the checkpoint's weights), then the
synced run. The reward is measured on the server's own rollouts, so it rises
only if the weights flow.
"""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from examples.rl_loop import (
    INITIAL_VERSION_ARGS,
    LEARNING_RATES,
    LoopConfig,
    LoopResult,
    run_loop,
)
from rlsync.sender import Engine

# The trainer-side code is the subject; the first pin's run covers it.
pytestmark = pytest.mark.release_independent

STEPS = 12
CONFIG = LoopConfig(steps=STEPS, seed=0, lr=LEARNING_RATES["test"])
# Digits are 10 of the 512 token ids: the untrained policy's reward is ~0.02.
UNTRAINED_CEILING = 0.1
# How far the synced run's last steps must rise above the control's.
MARGIN = 0.3


def late_reward(result: LoopResult) -> float:
    """The mean reward of the last three steps."""
    return statistics.mean(result.rewards[-3:])


def assert_sound(result: LoopResult) -> None:
    """No rollout request failed, every sample came from a published
    version, and none from a version newer than the trainer's."""
    assert result.failures == [], result.failures
    assert len(result.steps) == STEPS
    for record in result.steps:
        assert set(record.versions) <= set(result.published), record
        assert min(record.staleness) >= 0, record


@pytest.mark.needs("two_phase_weight_update")
def test_policy_learns_only_when_weights_are_synced(start_server, tiny_model):
    server = start_server(tp=1, extra_args=INITIAL_VERSION_ARGS)
    engines = [Engine(server.url, tp_size=1)]

    control = run_loop(engines, tiny_model, dataclasses.replace(CONFIG, sync=False))
    trained = run_loop(engines, tiny_model, CONFIG)

    assert_sound(control)
    assert_sound(trained)
    assert control.published == [0]
    assert trained.published == list(range(STEPS + 1))
    # The weights flowed: the last steps learnt from recent versions.
    assert max(trained.steps[-1].versions) >= STEPS - 2, trained.steps[-1]
    untrained = statistics.mean(control.rewards)
    assert untrained < UNTRAINED_CEILING, control.rewards
    assert late_reward(control) < UNTRAINED_CEILING, control.rewards
    assert (
        late_reward(trained) > late_reward(control) + MARGIN
    ), f"synced {trained.rewards} vs control {control.rewards}"
    # Serving went on during the syncs.
    assert sum(r.tokens_during_sync for r in trained.steps) > 0
