"""The LM policy on a real pretrained chat model (SmolLM2-135M-Instruct, BPE, 8k context):
a turn rendered with tools, its tokens and log-probs recorded, an IS-GRPO step on the LoRA."""

import pytest
import torch

from nestor.agent.prompt import system_prompt, task_message
from nestor.policy.base import Message, Observation, TrainItem
from nestor.policy.lm import LMPolicy
from nestor.policy.lm_sequence import token_logprobs
from nestor.sandbox.workspace import TOOL_SCHEMAS
from nestor.tasks import TaskRegistry

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol_agent(smollm_dir):
    torch.set_num_threads(2)
    return LMPolicy.from_pretrained("smollm2-135m", learning_rate=1e-3, max_new_tokens=12,
                                    seed=0)


def test_compact_agent_prompt_fits_the_context_with_room_to_write(smollm_dir):
    from nestor.models.registry import load_tokenizer

    tok = load_tokenizer("smollm2-135m")
    spec = TaskRegistry([]).get("length").spec()
    sizes = {}
    for style in ("full", "compact"):
        text = tok.apply_chat_template(
            [{"role": "system", "content": system_prompt(
                spec, models=["tiny-m"], token_budget=150_000, max_attempts=3, style=style)},
             {"role": "user", "content": task_message(spec)}],
            tools=TOOL_SCHEMAS, add_generation_prompt=True, tokenize=False)
        assert "write_file" in text and "<tools>" in text  # the tools reach the model
        sizes[style] = len(tok(text, add_special_tokens=False).input_ids)
    assert sizes["compact"] < 0.5 * sizes["full"] and sizes["compact"] + 4096 < 8192


def test_turn_records_tokens_logprobs_and_trains_lora_on_policy(smol_agent):
    agent = smol_agent
    obs = Observation([Message("system", "You write files with tools."),
                       Message("user", "Write hello.txt containing hi.")], TOOL_SCHEMAS[:1])
    turn = agent.act(obs)
    assert turn.context_ids[-3:] == agent.tokenizer(
        "<|im_start|>assistant\n", add_special_tokens=False).input_ids[-3:]
    assert 1 <= len(turn.action_ids) <= 12 and len(turn.sample_logprobs) == len(turn.action_ids)
    assert all(lp <= 0 for lp in turn.sample_logprobs)
    # The recorded log-probs are the policy's own: a fresh forward reproduces them.
    with torch.no_grad():
        again = token_logprobs(agent.model, turn.context_ids, turn.action_ids, agent.temperature)
    assert torch.allclose(again, torch.tensor(turn.sample_logprobs), atol=2e-4)

    lora = {n: p.detach().clone() for n, p in agent.model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach().clone() for n, p in agent.model.named_parameters()
              if not p.requires_grad and "embed_tokens" in n}
    assert lora and all("lora_" in n for n in lora)
    stats = agent.train_step([TrainItem(turns=[turn], advantage=1.0, policy_version=0)])
    # On-policy, IS-GRPO's ratio is exactly 1 on every token.
    assert abs(stats["ratio_mean"] - 1.0) < 1e-3 and abs(stats["ratio_max"] - 1.0) < 1e-3
    assert stats["tokens"] == len(turn.action_ids) and stats["grad_norm"] > 0
    changed = [n for n, p in agent.model.named_parameters()
               if p.requires_grad and not torch.equal(p.detach(), lora[n])]
    assert changed  # the adapter moved
    assert all(torch.equal(p.detach(), frozen[n]) for n, p in agent.model.named_parameters()
               if n in frozen)  # the base did not
    with torch.no_grad():
        after = token_logprobs(agent.model, turn.context_ids, turn.action_ids, agent.temperature)
    assert after.sum() > again.sum()  # a positive advantage made the turn more likely
