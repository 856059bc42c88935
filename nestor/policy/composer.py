"""The composer: a learnable, factored categorical policy over job-writing decisions.

It starts as a plausible naive job writer, not a uniform sampler: one decision,
`config_mode`, keeps the scaffold's whole config (nestor/job/scaffold.py: JobConfig's defaults,
the base model's learning rate, the task's answer length, max_steps fitted to the token budget)
with probability `p_keep_scaffold` (0.75) at version 0. Only when it tunes does it sample the
JobConfig knobs, each over a grid whose first choice is the scaffold's value (kept with
`p_knob_scaffold`, 0.5). Learning rates are relative to the base model's scale
(nestor/models/registry.py). So hyperparameter-surface use starts near 0.25 and moves with
the reward either way. Three decisions are a naive writer's slips (`WRITER_SLIPS`: a plain
`def` reward, no `__all__`, dataset rows keyed `question` or holding chat messages; see
composer_files.py): each makes one of these mistakes with probability `p_slip` (0.1) at version
0, and every one of them fails the real validation probe. The other decisions (base model, how
the dataset is built, how many rows, the rubric's form and answer extraction, the prompt
framing) start uniform; some of their choices fail validation too (8 rows, `after_marker`). Each has its
own logits: a shared vector plus, when `family_conditioned`, a per-family offset, and for the
config decisions (`MODEL_CONDITIONED`), when `model_conditioned`, a per-base-model offset — a
learning rate that suits one model can ruin another (benchmarks/job_payoffs.py). One episode
samples its decisions once, renders the job's files and writes them through the workspace
tools, then submits. After a failed validation it reads the report, resamples only the
decisions the failing checks point at (the keep decision, for knobs of a kept config),
rewrites the files and submits again. With the episode's seed in the observation it samples
from a generator of that seed, so an episode is reproducible whatever runs beside it.

The composer is stateless between calls: its plan (the chosen indices and the data seed) is
the text of its own previous turn, so concurrent episodes can share one composer.

Each Turn carries `action_keys` ("decision@family", "decision@family/model"), `action_ids`
(choice indices) and `sample_logprobs`; `train_step` applies the outer loss to them:
    loss = −Σ_actions min(r·A, clip(r, 1−ε, 1+ε)·A) / n_episodes,   r = exp(logp_θ − logp_sample)
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from nestor.job.config import DEFAULT_TOKEN_BUDGET, JobConfig
from nestor.job.scaffold import scaffold_config
from nestor.policy import composer_files as files
from nestor.policy.base import Message, Observation, ToolCall, TrainItem, Turn
from nestor.policy.composer_decisions import (
    CONFIG_KNOBS,
    CONFIG_MODES,
    DATA_DECISIONS,
    MODEL_CONDITIONED,
    PLAN,
    WRITER_SLIPS,
    blame,
    copied_fixes,
    knob_value,
    last_plan,
    split_key,
    written_files,
)
from nestor.policy.composer_short import rows_source
from nestor.policy.credit import MarginalCredit
from nestor.policy.programs import build_rows, explain
from nestor.tasks import TaskSpec


class ComposerConfig(BaseModel):
    base_models: list[str] = Field(["tiny-s", "tiny-m"], min_length=1,
                                   description="Base models the composer chooses among.")
    families: list[str] = Field(["strings", "arithmetic", "counting", "formatting"],
                                description="Families with their own logit offsets.")
    family_conditioned: bool = Field(True, description="Add a per-family offset to the "
                                     "shared logits of every decision.")
    model_conditioned: bool = Field(True, description="Add a per-base-model offset to the "
                                    "logits of the config decisions (MODEL_CONDITIONED).")
    token_budget: int = Field(DEFAULT_TOKEN_BUDGET, gt=0, description="The job's sampled-token "
                              "cap the budget-relative max_steps choices aim at.")
    lr: float = Field(0.05, gt=0, le=10, description="Adam learning rate of the logits.")
    clip_ratio: float = Field(0.2, ge=0, le=1, description="Ratio clip ε; 0 = unclipped.")
    seed: int = Field(0, ge=0, description="Seed of the sampling generator.")
    p_keep_scaffold: float = Field(0.75, gt=0, lt=1, description="Version-0 probability of "
                                   "keeping the scaffold's whole config (a naive writer).")
    p_knob_scaffold: float = Field(0.5, gt=0, lt=1, description="Version-0 probability, once "
                                   "tuning, of keeping a knob at the scaffold's value.")
    p_slip: float = Field(0.1, ge=0, lt=1, description="Version-0 probability of each of a "
                          "naive writer's slips (WRITER_SLIPS: plain-def reward, no __all__, "
                          "wrong row keys); every slip fails validation.")
    credit: Literal["marginal", "episode"] = Field(
        "marginal", description="marginal: each decision learns from its choices' pooled mean "
        "advantages (nestor/policy/credit.py), SGD at credit_lr; episode: every action gets the "
        "episode's advantage, the IS-GRPO loss with Adam at lr.")
    credit_lr: float = Field(5.0, gt=0, le=1000, description="marginal: SGD rate on the logits.")
    repair: Literal["resample", "read_report"] = Field(
        "resample", description="resample: a retry resamples the decisions the failing checks "
        "point at; read_report: a budget refusal's `max_steps = K fits` is copied into the "
        "config, the batch kept (the repair a demonstration for nestor sft should show).")
    job_form: Literal["long", "short"] = Field(
        "long", description="long: the rows in data/train.jsonl; short: load() draws them in "
        "code (composer_short.py) — a job an LM can type, for demonstrations (nestor sft). "
        "The short form has no data file, so the `row_keys` slip does not apply.")
    credit_prior: float = Field(4.0, ge=0, description="marginal: pseudo-episodes at advantage "
                                "0 that shrink each choice's estimate.")
    credit_decay: float = Field(0.9, gt=0, le=1, description="marginal: weight kept per step "
                                "by older evidence.")


class Composer:
    """See the module docstring. `act` is thread-safe."""

    name = "composer"

    def __init__(self, config: ComposerConfig | None = None):
        self.config = config or ComposerConfig()
        self.version = 0
        self.decisions: dict[str, list[Any]] = {"base_model": list(self.config.base_models),
                                                "config_mode": list(CONFIG_MODES),
                                                **CONFIG_KNOBS, **DATA_DECISIONS,
                                                **WRITER_SLIPS}
        self.shared = torch.nn.ParameterDict(
            {k: torch.nn.Parameter(self._prior(k, len(v))) for k, v in self.decisions.items()})
        self.by_family = torch.nn.ParameterDict(
            {f"{fam}__{k}": torch.nn.Parameter(torch.zeros(len(v)))
             for fam in self.config.families for k, v in self.decisions.items()}
            if self.config.family_conditioned else {})
        self.by_model: dict[str, torch.nn.Parameter] = {  # a plain dict: names hold dots
            f"{m}__{k}": torch.nn.Parameter(torch.zeros(len(self.decisions[k])))
            for m in self.config.base_models for k in MODEL_CONDITIONED
        } if self.config.model_conditioned else {}
        self.optimizer = torch.optim.Adam(self.parameters(), lr=self.config.lr)
        self._gen = torch.Generator().manual_seed(self.config.seed)
        self._lock = threading.Lock()
        self.credit = MarginalCredit(self.config.credit_prior, self.config.credit_decay)

    def _prior(self, decision: str, n: int) -> torch.Tensor:
        """Version-0 logits of a naive writer: keep the scaffold's config with probability
        p_keep_scaffold; when tuning, keep each knob with p_knob_scaffold; make each slip with
        p_slip; else uniform."""
        out = torch.zeros(n)
        p = (self.config.p_keep_scaffold if decision == "config_mode" else
             self.config.p_knob_scaffold if decision in CONFIG_KNOBS else
             1 - self.config.p_slip if decision in WRITER_SLIPS else None)
        if p is not None:  # choice 0 (keep, or the right way) gets p, the n − 1 others 1 − p
            out[0] = math.log(p * (n - 1) / (1 - p)) if p < 1 else 30.0
        return out

    def parameters(self) -> list[torch.nn.Parameter]:
        return [*self.shared.values(), *self.by_family.values(), *self.by_model.values()]

    # -- the distribution ---------------------------------------------------------------------
    def _action_key(self, decision: str, family: str, model: str = "") -> str:
        """"decision", "decision@family", "decision@family/model" or "decision@/model": the
        parts this composer has offsets for."""
        fam = family if f"{family}__{decision}" in self.by_family else ""
        mod = model if f"{model}__{decision}" in self.by_model else ""
        suffix = fam + (f"/{mod}" if mod else "")
        return f"{decision}@{suffix}" if suffix else decision

    def _known_key(self, key: str) -> str:
        """A recorded key reduced to the offsets this composer has (e.g. after a config
        change)."""
        decision, family, model = split_key(key)
        return self._action_key(decision, family, model)

    def logits(self, action_key: str) -> torch.Tensor:
        decision, family, model = split_key(action_key)
        out = self.shared[decision]  # [n_choices]
        if family:
            out = out + self.by_family[f"{family}__{decision}"]
        if model:
            out = out + self.by_model[f"{model}__{decision}"]
        return out

    def probabilities(self, family: str = "", model: str = "") -> dict[str, dict[str, float]]:
        """Current choice probabilities per decision (for reports and tests)."""
        with torch.no_grad():
            return {d: {str(c): float(p) for c, p in zip(
                choices, torch.softmax(self.logits(self._action_key(d, family, model)), -1),
                strict=True)} for d, choices in self.decisions.items()}

    def _sample(self, names: list[str], family: str, gen: torch.Generator,
                model: str = "") -> tuple[list[str], list[int], list[float]]:
        """Sample `names` in order; once `base_model` is drawn, the config decisions after it
        are conditioned on the model drawn (else on `model`)."""
        keys, ids, logps = [], [], []
        with torch.no_grad(), self._lock:
            for name in names:
                key = self._action_key(name, family, model)
                logp = torch.log_softmax(self.logits(key), -1)
                idx = int(torch.multinomial(logp.exp(), 1, generator=gen))
                keys.append(key)
                ids.append(idx)
                logps.append(float(logp[idx]))
                if name == "base_model":
                    model = str(self.decisions["base_model"][idx])
        return keys, ids, logps

    def _generator(self, obs: Observation) -> torch.Generator:
        """The episode's own generator when the observation carries a seed (one stream per
        turn), else the composer's shared one (saved in its checkpoint)."""
        if obs.seed is None:
            return self._gen
        turn = sum(1 for m in obs.messages if m.role == "assistant")
        return torch.Generator().manual_seed((int(obs.seed) * 7919 + turn) % 2**63)

# -- acting -------------------------------------------------------------------------------
    def act(self, obs: Observation) -> Turn:
        spec = obs.spec
        if spec is None:
            return Turn(Message("assistant", "The composer needs the task spec in the "
                                "observation; it cannot read prose."))
        gen = self._generator(obs)
        plan = last_plan(obs.messages)
        if plan is None:  # first turn: every decision (knobs only when tuning), and a data seed
            names = [d for d in self.decisions if d not in CONFIG_KNOBS]
            keys, ids, logps = self._sample(names, spec.family, gen)
            choices, fixed = dict(zip(names, ids, strict=True)), {}
            with self._lock:
                data_seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
        else:
            choices = dict(plan["choices"])
            copied = copied_fixes(obs.messages) if self.config.repair == "read_report" else {}
            fixed = {**plan.get("fixed", {}), **copied}
            blamed = blame(obs.messages, self.decisions,
                           skip=frozenset({"budget"} if copied else ()))
            if choices.get("config_mode", 0) == 0 and any(b in CONFIG_KNOBS for b in blamed):
                # knobs of a kept scaffold config cannot change: the decision to keep it can
                blamed = [b for b in blamed if b not in CONFIG_KNOBS]
                blamed = [d for d in self.decisions if d in {*blamed, "config_mode"}]
            if not blamed and not copied:  # nothing to fix (the last submit never ran)
                return Turn(Message("assistant", PLAN + json.dumps(plan),
                                    [ToolCall("submit", {}, "c0")]))
            keys, ids, logps = self._sample(blamed, spec.family, gen,
                                            self._model_of(choices))
            choices.update(zip(blamed, ids, strict=True))
            data_seed = plan["data_seed"]
        if self.decisions["config_mode"][choices["config_mode"]] == "tune":
            missing = [k for k in CONFIG_KNOBS if k not in choices]
            if missing:  # newly tuning: every knob gets its own decision
                k2, i2, l2 = self._sample(missing, spec.family, gen, self._model_of(choices))
                keys, ids, logps = keys + k2, ids + i2, logps + l2
                choices.update(zip(missing, i2, strict=True))
        calls = self._write_calls(spec, choices, data_seed, fixed)
        if plan is not None:  # a repair writes only what changed: demos of it teach fixing
            written = written_files(obs.messages)
            calls = [c for c in calls if c.name != "write_file"
                     or written.get(c.arguments["path"]) != c.arguments["content"]]
            calls = [ToolCall(c.name, c.arguments, f"c{i}") for i, c in enumerate(calls)]
        plan = {"choices": choices, "data_seed": data_seed,
                "values": {k: self.decisions[k][i] for k, i in choices.items()},
                **({"fixed": fixed} if fixed else {})}
        return Turn(Message("assistant", PLAN + json.dumps(plan), calls),
                    action_ids=ids, sample_logprobs=logps, action_keys=keys)

    def _model_of(self, choices: dict[str, int]) -> str:
        return str(self.decisions["base_model"][choices["base_model"]])

    def job_config(self, spec: TaskSpec, choices: dict[str, int], seed: int,
                   fixed: dict[str, Any] | None = None) -> JobConfig:
        """The JobConfig of a plan: the scaffold's config, or (`config_mode` tune) each knob's
        choice resolved against it; `fixed` values (copied from a report) override both."""
        cfg = self._chosen_config(spec, choices, seed)
        return JobConfig(**{**cfg.model_dump(), **fixed}) if fixed else cfg

    def _chosen_config(self, spec: TaskSpec, choices: dict[str, int], seed: int) -> JobConfig:
        base_model = self.decisions["base_model"][choices["base_model"]]
        scaffold = scaffold_config(base_model, spec.max_new_tokens, self.config.token_budget)
        mode = self.decisions["config_mode"][choices.get("config_mode", 0)]
        if mode == "keep_scaffold":
            return scaffold.model_copy(update={"seed": seed})
        cfg: dict[str, Any] = {"base_model": base_model}
        order = ("prompts_per_step", "group_size", "max_new_tokens", "lora_rank", "temperature",
                 "lora_alpha", "clip_ratio", "kl_coef", "updates_per_step", "scale_rewards",
                 "skip_zero_variance", "weight_decay", "grad_clip", "max_steps",
                 "learning_rate")  # max_steps needs the batch shape; the rate, model and LoRA
        for key in order:
            value = self.decisions[key][choices.get(key, 0)]
            cfg[key] = knob_value(key, value, cfg, scaffold, spec, self.config.token_budget)
        return JobConfig(**cfg, seed=seed)

    def _write_calls(self, spec: TaskSpec, choices: dict[str, int], seed: int,
                     fixed: dict[str, Any] | None = None) -> list[ToolCall]:
        value = {k: self.decisions[k][i] for k, i in choices.items()}
        cfg = self.job_config(spec, choices, seed, fixed)
        rows, info = build_rows(spec.examples, title=spec.title, source=value["data_source"],
                                n_rows=value["n_rows"], widen=value["input_range"] == "widened",
                                framing=value["framing"], seed=seed)
        note = (f"{len(rows)} rows, source {info['source']}"
                + (f" via program `{info['program']}`" if info["program"] else "")
                + (" (no program explains the examples: fell back to them as given)"
                   if info["fallback"] else "") + f", framing {value['framing']}")
        pkg = files.package_name(spec.id)
        slips = {k: value.get(k, v[0]) for k, v in WRITER_SLIPS.items()}  # old plans: none
        rows_src = None
        if self.config.job_form == "short":
            rows_src, note = rows_source(
                spec.examples, explain(spec.examples), source=value["data_source"],
                n_rows=value["n_rows"], widen=value["input_range"] == "widened",
                framing=value["framing"], title=spec.title, seed=seed)
        writes = {
            "config.toml": files.config_toml(cfg, f"composer v{self.version} for {spec.id}"),
            "data/train.jsonl": files.jsonl(files.keyed_rows(rows, slips["row_keys"])),
            "env/pyproject.toml": files.pyproject(spec.id),
            f"env/{pkg}/__init__.py": files.env_source(
                title=spec.title, rubric=value["rubric"], extract=value["extract"],
                rows_note=note, reward_def=slips["reward_def"], exports=slips["exports"],
                rows_src=rows_src),
        }
        if rows_src is not None:
            del writes["data/train.jsonl"]
        calls = [ToolCall("write_file", {"path": p, "content": c}, f"c{i}")
                 for i, (p, c) in enumerate(writes.items())]
        return [*calls, ToolCall("submit", {}, f"c{len(calls)}")]

    # -- learning -----------------------------------------------------------------------------
    def logprob_sum(self, turns: list[Turn]) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp_θ, logp_sample) of every composer action in `turns`, each [n_actions]."""
        now, then = [], []
        for turn in turns:
            for key, idx, old in zip(turn.action_keys, turn.action_ids, turn.sample_logprobs,
                                     strict=True):
                decision = key.partition("@")[0]
                if decision not in self.decisions or idx >= len(self.decisions[decision]):
                    continue  # a decision this composer no longer has: no gradient
                now.append(torch.log_softmax(self.logits(self._known_key(key)), -1)[idx])
                then.append(old)
        if not now:
            return torch.zeros(0), torch.zeros(0)
        return torch.stack(now), torch.tensor(then)

    def train_step(self, batch: list[TrainItem]) -> dict[str, float]:
        if self.config.credit == "marginal":
            return self._marginal_step(batch)
        return self._episode_step(batch)

    def _marginal_step(self, batch: list[TrainItem]) -> dict[str, float]:
        """Pool the batch into each choice's marginal advantage, then one SGD step on the
        all-choice objective (nestor/policy/credit.py)."""
        actions = []
        for item in batch:
            # Only the first plan: a retry's choices exist only in episodes whose first submit
            # failed, so their pooled mean advantage is that failure's, not theirs — crediting
            # them would push down the very fix (choice 0 of a slip) the retry made.
            first = next((t for t in item.turns if t.action_keys), None)
            if first is None:
                continue
            for key, idx in zip(first.action_keys, first.action_ids, strict=True):
                decision = key.partition("@")[0]
                if decision in self.decisions and idx < len(self.decisions[decision]):
                    actions.append((self._known_key(key), len(self.decisions[decision]),
                                    idx, float(item.advantage)))
        if not actions:
            return {"loss": 0.0, "n_episodes": 0.0}
        self.credit.update(actions)
        terms = []
        for key in self.credit.keys():
            est = self.credit.estimates(key)  # [n_choices]
            terms.append(-(torch.softmax(self.logits(key), -1) * est).sum())
        loss = torch.stack(terms).sum()
        for p in self.parameters():
            p.grad = None
        loss.backward()
        with torch.no_grad():
            for p in self.parameters():
                if p.grad is not None:
                    p -= self.config.credit_lr * p.grad
        self.version += 1
        spread = max(float(self.credit.estimates(k).max() - self.credit.estimates(k).min())
                     for k in self.credit.keys())
        return {"loss": float(loss.detach()), "n_episodes": float(len(batch)),
                "n_actions": float(len(actions)), "credit_spread_max": spread,
                "entropy": self._entropy()}

    def _episode_step(self, batch: list[TrainItem]) -> dict[str, float]:
        eps = self.config.clip_ratio
        losses, ratios, clipped = [], [], 0
        for item in batch:
            logp_now, logp_sample = self.logprob_sum(item.turns)  # [n_actions] each
            if logp_now.numel() == 0:
                continue
            ratio = torch.exp(logp_now - logp_sample)  # [n_actions]
            adv = torch.tensor(float(item.advantage))
            objective = ratio * adv
            if eps > 0:
                objective = torch.minimum(objective, ratio.clamp(1 - eps, 1 + eps) * adv)
                clipped += int(((ratio - 1).abs() > eps).sum())
            losses.append(-objective.sum())
            ratios.append(ratio.detach())
        if not losses:
            return {"loss": 0.0, "n_episodes": 0.0}
        loss = torch.stack(losses).sum() / len(batch)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.version += 1
        all_ratios = torch.cat(ratios)
        return {"loss": float(loss.detach()), "n_episodes": float(len(losses)),
                "n_actions": float(all_ratios.numel()), "ratio_mean": float(all_ratios.mean()),
                "clip_frac": clipped / all_ratios.numel(), "entropy": self._entropy()}

    def _entropy(self) -> float:
        with torch.no_grad():
            ent = [-(torch.softmax(v, -1) * torch.log_softmax(v, -1)).sum() for v in
                   self.shared.values()]
            return float(torch.stack(ent).mean())

    def save(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"version": self.version, "config": self.config.model_dump(),
                    "params": {k: v.detach() for k, v in
                               [*self.shared.items(),
                                *(("family:" + k, v) for k, v in self.by_family.items()),
                                *(("model:" + k, v) for k, v in self.by_model.items())]},
                    "optimizer": self.optimizer.state_dict(),
                    "rng": self._gen.get_state(), "credit": self.credit.state_dict()}, path)

    def load(self, path: Path) -> None:
        state = torch.load(Path(path), weights_only=True)
        with torch.no_grad():
            for k, v in state["params"].items():
                prefix, _, rest = k.partition(":")
                table, name = {"family": (self.by_family, rest), "model": (self.by_model, rest)
                               }.get(prefix, (self.shared, k))
                if name in table and table[name].shape == v.shape:
                    table[name].copy_(v)
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except ValueError:
            pass  # a different decision set: fresh optimizer moments
        self.version = int(state["version"])
        if "rng" in state:  # a resumed run continues the sampling stream, not its step-0 draws
            self._gen.set_state(state["rng"])
        if "credit" in state:
            self.credit.load_state_dict(state["credit"])
