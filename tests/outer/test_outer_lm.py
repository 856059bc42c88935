"""The loop driving the LM policy (tiny-m + LoRA): steps, checkpoints and a resume that restores
the adapter. The episode is a real, cheap one: the LM answers with tools and is paid for
replies that start with a tool call."""

import pytest
import torch

from nestor.outer.config import RunConfig
from nestor.outer.groups import EpisodeSummary
from nestor.outer.loop import OuterLoop
from nestor.policy.base import Message, Observation
from nestor.policy.lm_sequence import token_logprobs

TOOLS = [{"type": "function", "function": {"name": "submit", "description": "submit the job",
                                           "parameters": {"type": "object", "properties": {}}}}]


def lm_episode(policy, ticket) -> EpisodeSummary:
    version = policy.version
    turn = policy.act(Observation([Message("user", f"Task {ticket.task_id}: submit.")], TOOLS))
    text = policy.tokenizer.decode(turn.action_ids, skip_special_tokens=False)
    reward = float(text.startswith("<tool_call>")) + 0.01 * ticket.slot  # never zero-variance
    return EpisodeSummary(ticket.group_id, ticket.slot, ticket.task_id, reward, version,
                          turns=[turn], info={"malformed_calls": int(bool(turn.parse_error))})


@pytest.mark.slow
def test_loop_trains_and_resumes_the_lm_policy(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "policy"))
    from test_lm import tiny_agent

    torch.set_num_threads(1)
    config = RunConfig(tasks=["a", "b"], group_size=2, groups_per_step=2, max_in_flight=4,
                       steps=2, learning_rate=1e-2, policy={"kind": "lm"})
    policy = tiny_agent(bundled=False, learning_rate=1e-2, max_new_tokens=8)
    first = OuterLoop(config, policy, lm_episode, tmp_path)
    rows = first.run()
    assert first.join() == 0  # episodes past the last step stop at their next turn
    assert [r["step"] for r in rows] == [1, 2] and policy.version == 2
    assert all(abs(r["train"]["ratio_mean"] - 1.0) < 0.05 for r in rows)
    adapter = tmp_path / "checkpoints" / "step-000002" / "policy" / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file()

    # A fresh process's policy resumes from the checkpoint: same adapter, same version.
    fresh = tiny_agent(bundled=False, learning_rate=1e-2, max_new_tokens=8)
    loop = OuterLoop(config.model_copy(update={"steps": 3}), fresh, lm_episode, tmp_path)
    assert loop.resume() and fresh.version == 2 and loop.step == 2
    probe = policy.act(Observation([Message("user", "probe")], TOOLS))
    with torch.no_grad():
        a = token_logprobs(policy.model, probe.context_ids, probe.action_ids, 1.0)
        b = token_logprobs(fresh.model, probe.context_ids, probe.action_ids, 1.0)
    assert torch.allclose(a, b, atol=1e-5)
    loop.run()
    loop.join()
    assert fresh.version == 3
