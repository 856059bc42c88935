"""The token context of an LM policy's next turn.

Turn 1 renders the conversation with the chat template. Every later turn of the same episode
extends what the model saw and sampled: the previous turn's context + its sampled tokens (+ an
end-of-turn token if it was cut) + the template's text for the messages since (the tool
results, the next generation prompt). The model reads its own tokens, never a re-rendering of
them (a template re-encodes tool calls and strips prose and thinking), and each context is a
prefix extension of the last, so the episode trains in one forward pass
(nestor/policy/lm_sequence.py). Where there is nothing to extend (a new episode, a conversation
this policy did not sample, a context cut to the window), the template renders it all.

For a demonstration whose assistant turns are tokenised as the template renders them, the two
ways give the same tokens: the template's text after an assistant turn's end-of-turn token
starts at a special token, so tokenising it apart merges nothing differently.
"""

from __future__ import annotations

from collections import OrderedDict

from nestor.policy.base import Message, Observation
from nestor.policy.chat import to_hf_messages

HISTORY_ENTRIES = 256  # episodes' last turns remembered for extending their contexts


class ContextRenderer:
    """Not thread-safe (a fast tokenizer is not): the policy calls it under its lock."""

    def __init__(self, tokenizer, *, eos_id: int, prefix_ids: list[int], keep: int,
                 extend: bool = True):
        self.tokenizer, self.eos_id, self.prefix_ids = tokenizer, eos_id, prefix_ids
        self.keep, self.extend = keep, extend  # keep: context tokens that fit (> 0)
        # (episode seed, the rendered conversation up to and including our reply) -> the
        # tokens the model saw and sampled for it; the seed because two episodes of a group
        # may word a reply alike
        self._history: OrderedDict[tuple[int | None, str], list[int]] = OrderedDict()
        self.extended = self.rerendered = 0

    def template(self, messages: list[Message], tools, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            to_hf_messages(messages), tools=tools or None,
            add_generation_prompt=generation_prompt, tokenize=False)

    def fit(self, ids: list[int]) -> list[int]:
        return ids[-self.keep:] if len(ids) > self.keep else ids  # the most recent context wins

    def render(self, obs: Observation) -> list[int]:
        """The conversation as the chat template renders it, ending with the generation prompt
        (and the response prefix), cut to the context window."""
        text = self.template(obs.messages, obs.tools, True)
        return self.fit(self.tokenizer(text, add_special_tokens=False).input_ids
                        + self.prefix_ids)

    def context_for(self, obs: Observation) -> list[int]:
        """The next turn's context: an extension of this episode's last turn, else `render`."""
        last = max((i for i, m in enumerate(obs.messages) if m.role == "assistant"), default=-1)
        if self.extend and last >= 0:
            upto = self.template(obs.messages[:last + 1], obs.tools, False)
            seen = self._history.get((obs.seed, upto))
            full = self.template(obs.messages, obs.tools, True)
            end = upto.rfind(self.tokenizer.eos_token)
            if seen is not None and full.startswith(upto) and end >= 0:
                # the template's text after our reply's end-of-turn, then the new messages
                rest = upto[end + len(self.tokenizer.eos_token):] + full[len(upto):]
                self.extended += 1
                return self.fit(seen + self.tokenizer(rest, add_special_tokens=False).input_ids
                                + self.prefix_ids)
            self.rerendered += 1
        return self.render(obs)

    def remember(self, obs: Observation, message: Message, context: list[int],
                 actions: list[int]) -> None:
        """Record what the model saw (`context`) and sampled (`actions`) for `message`."""
        if not self.extend:
            return
        key = (obs.seed, self.template([*obs.messages, message], obs.tools, False))
        ended = actions if actions and actions[-1] == self.eos_id else [*actions, self.eos_id]
        self._history[key] = list(context) + ended
        while len(self._history) > HISTORY_ENTRIES:
            self._history.popitem(last=False)
