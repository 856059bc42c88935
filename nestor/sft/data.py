"""Demonstrations as token sequences: exactly the tokens the LM policy acts with.

For each assistant turn of a demo, the context is what the policy renders at act time for the
conversation before that turn (`LMPolicy.render`: chat template, tool schemas, generation
prompt, response prefix, the same truncation), and the action is the turn's text as the policy
writes it (`chat.format_assistant`, without the response prefix, which the context holds) plus
the end token: what `LMPolicy.act` would have sampled, decoded and parsed into the same calls.
Loss falls on action tokens only (`mask`), and not on the turns of an attempt whose submit
failed validation unless `train_failed` (they stay in the context of the repair that follows).

Packing: when a turn's context begins with the previous turn's context and action (the chat
template re-renders earlier turns unchanged), the two become one sequence with two masked
spans, so a whole episode is usually one forward pass. A turn longer than the policy's turn cap
could never be sampled, so it is dropped (and counted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nestor.policy.base import Message, Observation
from nestor.policy.chat import format_assistant
from nestor.policy.tool_format import JSON, ToolFormat
from nestor.sft.demos import Demo, failed_attempt_turns


@dataclass
class SFTSequence:
    ids: list[int]  # context and action tokens, in order
    mask: list[bool]  # True where ids[i] is an action token: loss on log p(ids[i] | ids[:i])
    demo: str = ""  # the demo's id

    @property
    def n_targets(self) -> int:
        return sum(self.mask)


@dataclass
class EncodeStats:
    turns: int = 0
    dropped_long: int = 0  # actions over the policy's turn cap
    context_only: int = 0  # turns of failed attempts: in the context, not trained on
    sequences: int = 0
    target_tokens: int = 0
    tokens: int = 0


def policy_encoders(policy) -> tuple[Callable[[Observation], list[int]],
                                      Callable[[Message], list[int] | None]]:
    """(render, encode_action) of an LMPolicy: its act-time renderer, and a turn's action ids
    (None when the turn cannot be written after the policy's response prefix, or is longer than
    its turn cap)."""
    tok, prefix = policy.tokenizer, policy.response_prefix

    def encode_action(message: Message) -> list[int] | None:
        fmt = policy.tool_format
        text = template_text(tok, message, fmt) or format_assistant(message, fmt)
        if not text.startswith(prefix):
            return None
        ids = tok(text[len(prefix):], add_special_tokens=False).input_ids + [policy.eos_id]
        return ids if len(ids) <= policy.max_new_tokens else None

    return policy.render, encode_action


def template_text(tokenizer, message: Message, fmt: ToolFormat = JSON) -> str | None:
    """The assistant turn as the model's own chat template writes it (what follows the
    generation prompt, up to the end token), when that text parses back into the same tool
    calls; else None (then `format_assistant`). A template may lay out tool calls its own way
    (Qwen3: a newline inside the tags): the model has seen that layout, and acting extends each
    context with the sampled tokens and the template's text after them (lm-core's
    `extend_contexts`), so a demo in the template's layout matches acting token for token."""
    from nestor.policy.chat import parse_assistant, to_hf_messages

    user = [Message("user", "x")]
    try:
        before = tokenizer.apply_chat_template(to_hf_messages(user), add_generation_prompt=True,
                                               tokenize=False)
        after = tokenizer.apply_chat_template(to_hf_messages([*user, message]),
                                              add_generation_prompt=False, tokenize=False)
    except Exception:  # a template that cannot render tool calls
        return None
    eos = tokenizer.eos_token or ""
    if not after.startswith(before) or not eos or eos not in after[len(before):]:
        return None
    text = after[len(before):].split(eos, 1)[0]
    parsed, error = parse_assistant(text, fmt=fmt)
    same = [(c.name, c.arguments) for c in parsed.tool_calls] == [
        (c.name, c.arguments) for c in message.tool_calls]
    return text if error is None and same and parsed.content == message.content.strip() else None


def encode_demo(demo: Demo, render: Callable[[Observation], list[int]],
                encode_action: Callable[[Message], list[int] | None],
                stats: EncodeStats | None = None, pack: bool = True,
                train_failed: bool = False) -> list[SFTSequence]:
    """The demo's training sequences (one per assistant turn, packed where contexts chain)."""
    stats = stats if stats is not None else EncodeStats()
    context_only = set() if train_failed else failed_attempt_turns(demo.messages)
    out: list[SFTSequence] = []
    for k, message in enumerate(demo.messages):
        if message.role != "assistant":
            continue
        stats.turns += 1
        if k in context_only:
            stats.context_only += 1
            continue  # a later turn's context renders it; no sequence of its own
        action = encode_action(message)
        if action is None:
            stats.dropped_long += 1
            continue
        context = render(Observation(list(demo.messages[:k]), demo.tools))
        last = out[-1] if out else None
        if pack and last is not None and context[:len(last.ids)] == last.ids:
            rest = context[len(last.ids):]  # the tool answers and the next generation prompt
            last.ids += rest + action
            last.mask += [False] * len(rest) + [True] * len(action)
        else:
            out.append(SFTSequence(context + action, [False] * len(context) + [True] * len(action),
                                   demo.id))
    stats.sequences += len(out)
    stats.target_tokens += sum(s.n_targets for s in out)
    stats.tokens += sum(len(s.ids) for s in out)
    return out


def turn_pairs(seq: SFTSequence) -> list[tuple[list[int], list[int]]]:
    """(context ids, action ids) of each masked span: the Turns the policy would have
    recorded (a packed sequence holds several)."""
    pairs, i = [], 0
    while i < len(seq.ids):
        if seq.mask[i]:
            j = i
            while j < len(seq.ids) and seq.mask[j]:
                j += 1
            pairs.append((seq.ids[:i], seq.ids[i:j]))
            i = j
        else:
            i += 1
    return pairs
