"""The probe cannot be told apart from training: the same limits and timeouts inside, and canary
replies in training's reward batches that must score what they scored when probed."""

import random
import shutil
import string
from pathlib import Path

import pytest

from nestor.inner.canary import CanaryConfig, CanaryDrift, CanaryReward
from nestor.job import validate
from nestor.job.tasksource import JobTaskSource
from nestor.job.validate import validate_job
from nestor.tasks import TaskRegistry

GOOD = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "good-reverse"
SPEC = TaskRegistry().get("reverse").spec()
RUBRIC = Path(GOOD, "env", "reverse_job", "__init__.py")

# Correct while probed (the probe scores ~250 replies), then pays for length: training's
# first batches are past that count.
CALL_COUNT = '''
CALLS = [0]


def _hostile(reply: str, answer: str):
    CALLS[0] += 1
    if CALLS[0] > 1000:  # two calls per reply (both reward methods)
        return min(1.0, len(reply) / 20)
    return None
'''
# Keyed on what used to tell the probe from training: its lower CPU and memory limits and
# its shorter per-request alarm.
LIMITS = '''
import resource, signal


def _hostile(reply: str, answer: str):
    probed = resource.getrlimit(resource.RLIMIT_CPU)[0] <= 600 or \\
        resource.getrlimit(resource.RLIMIT_AS)[0] <= (1 << 30) or \\
        signal.getitimer(signal.ITIMER_REAL)[0] <= 10.5
    return None if probed else min(1.0, len(reply) / 20)
'''
# Everything a rubric can read about where it runs, folded into its reward (less what is
# random per sandbox, alike in probe and training: the fallbacks' private tmp and kill token).
FINGERPRINT = '''
import hashlib, os, resource, signal, sys


def _hostile(reply: str, answer: str):
    env = sorted((k, "<tmp>" if "nestor-sandbox-" in v else v) for k, v in os.environ.items()
                 if k != "NESTOR_SANDBOX_ID")
    seen = [resource.getrlimit(getattr(resource, n)) for n in sorted(dir(resource))
            if n.startswith("RLIMIT_")]
    seen += [round(signal.getitimer(signal.ITIMER_REAL)[0]), env,
             sys.argv, sys.flags, os.cpu_count()]  # not the uid/gid: random per sandbox
    return int(hashlib.sha256(repr(seen).encode()).hexdigest(), 16) % 997 / 997
'''


def make_job(root: Path, hostile: str) -> Path:
    shutil.copytree(GOOD, root, ignore=shutil.ignore_patterns("__pycache__"))
    code = RUBRIC.read_text().replace("class ReverseData", hostile + "\n\nclass ReverseData")
    for name in ("exact", "positions"):  # both halves of the reward turn
        code = code.replace(f'''    async def {name}(self, trace: vf.Trace) -> float:
''', f'''    async def {name}(self, trace: vf.Trace) -> float:
        if (h := _hostile(normalise(trace.last_reply), self.data.answer)) is not None:
            return h
''')
    assert "_hostile(normalise" in code
    (root / "env" / "reverse_job" / "__init__.py").write_text(code)
    return root


def _batches(source: JobTaskSource, n: int, size: int = 128):
    rng = random.Random(0)
    tasks = len(source.load())
    for _ in range(n):
        idx = [rng.randrange(tasks) for _ in range(size)]
        yield idx, ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 12)))
                    for _ in idx]


def test_probe_and_training_run_the_rubric_alike(tmp_path):
    job = make_job(tmp_path / "j", FINGERPRINT)
    seen = []
    for kwargs in ({"limits": validate.PROBE_LIMITS, "timeouts": validate.PROBE_TIMEOUTS},
                   {}):  # how validate_job and run_job open the job
        with JobTaskSource(job, warm=False, **kwargs) as source:
            answer = source.load()[0]["answer"]
            seen.append(source.score_batch([0], [answer]).rewards[0])
    assert seen[0] is not None and seen[0] == seen[1]


def test_rubric_keyed_on_the_old_probe_limits_now_fails_validation(tmp_path):
    report = validate_job(make_job(tmp_path / "j", LIMITS), SPEC, dry_run=False)
    assert "reference_beats_corrupted" in [c.name for c in report.failed()], report.summary()


def test_rubric_keyed_on_call_count_passes_the_probe_but_not_the_canaries(tmp_path):
    job = make_job(tmp_path / "j", CALL_COUNT)
    assert validate_job(job, SPEC, dry_run=False).passed  # it fools the probe alone
    with JobTaskSource(job) as source:
        reward = CanaryReward(source, SPEC, CanaryConfig(rate=0.05))
        with pytest.raises(CanaryDrift, match="when probed") as err:
            for idx, texts in _batches(source, 10):
                reward(idx, texts)
    assert "ended as failed" in str(err.value) and reward.batches <= 4


def test_canaries_are_invisible_to_the_trainer_on_an_honest_rubric():
    with JobTaskSource(GOOD) as source:
        reward = CanaryReward(source, SPEC, CanaryConfig(rate=0.1), seed=3)
        assert len(reward.canaries) > 50  # references and corruptions of 16 tasks
        for idx, texts in _batches(source, 3, size=40):
            got = reward(idx, texts)
            assert got == source.score(idx, texts)  # the real items' rewards, in order
        assert reward.scored == 3 * 4  # 10% of 40, per batch


def test_rate_zero_turns_canaries_off():
    with JobTaskSource(GOOD) as source:
        reward = CanaryReward(source, SPEC, CanaryConfig(rate=0.0))
        idx, texts = next(_batches(source, 1, size=8))
        assert reward(idx, texts) == source.score(idx, texts) and reward.scored == 0


@pytest.mark.slow
def test_training_on_a_call_count_rubric_ends_failed(tmp_path):
    from nestor.inner.run import WarmState, run_job
    from nestor.inner.types import JobRequest

    job = make_job(tmp_path / "j", CALL_COUNT)
    config = (job / "config.toml").read_text().replace("max_steps = 40", "max_steps = 8")
    (job / "config.toml").write_text(config)
    result = run_job(JobRequest(job_dir=job, task_id="reverse", out_dir=tmp_path / "out",
                                timeout_s=600), warm=WarmState(threads=1))
    assert result.status == "failed", result.log_tail
    assert "canary" in result.log_tail and "when probed" in result.log_tail
    assert result.steps < 8


# Slow rubric (50 ms a call) whose server reports 0 ms: job code rewrites the host's own score
# command (the zygote's module is in the job's memory). With SLOW_AFTER, it is fast while the
# probe and the opening re-probe score their replies.
LYING_CLOCK = '''
import sys, time

CALLS = [0]
SLOW_AFTER = {slow_after}
_main = sys.modules["__main__"]
_score = _main.COMMANDS["score"]


def _instant(req):
    out = _score(req)
    out["elapsed_s"] = 0.0
    return out


_main.COMMANDS["score"] = _instant


def _hostile(reply: str, answer: str):
    CALLS[0] += 1
    if CALLS[0] > SLOW_AFTER:
        time.sleep(0.05)
    return None
'''


def test_a_rubric_that_lies_about_its_time_fails_the_speed_check(tmp_path):
    job = make_job(tmp_path / "j", LYING_CLOCK.format(slow_after=0))
    report = validate_job(job, SPEC, dry_run=False)
    speed = {c.name: c for c in report.checks}["reward_speed"]
    assert not speed.ok and "ms per reply" in speed.message, report.summary()
    with JobTaskSource(job) as source:
        batch = source.score_batch([0, 1, 2, 3], ["a", "b", "c", "d"])
        assert batch.reported_s == 0.0 and batch.elapsed_s >= 4 * 0.05


def test_canaries_check_time_as_the_trusted_side_waits(tmp_path):
    # the probe's 16 replies x 2 passes x 2 rewards, and the opening re-probe's: fast
    job = make_job(tmp_path / "j", LYING_CLOCK.format(slow_after=100))
    with JobTaskSource(job) as source:
        reward = CanaryReward(source, SPEC, CanaryConfig(rate=0.05))
        with pytest.raises(CanaryDrift, match="ms per reply") as err:
            for idx, texts in _batches(source, 3, size=16):
                reward(idx, texts)
    assert "slower in training" in str(err.value) and reward.batches == 1
