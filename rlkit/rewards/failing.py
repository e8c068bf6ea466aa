"""A reward function that fails on every call stops the trainer instead of training on zeros for hours.

A failed call (an exception, a bad value, a timeout, a dead worker: rlkit.rewards.runner) scores 0.0 and is only
counted. A function that fails on every row (an import missing inside it, a wrong column name, a judge server that
is down) would otherwise leave GRPO with all-zero advantages (nothing learned, the compute wasted), or, in a mix of
reward.fns, a policy trained on the other functions alone. TRL and verl raise at once on a reward function's
exception; rlkit keeps scoring a flaky row 0.0, but stops once a function (each function of a mix on its own) has
failed on every one of its calls, at least one, in MAX_FAILING_STEPS steps in a row. A step in which it succeeded
once starts the count again; a step without a call of it (every group already scored) leaves the count as it is.

The stop is a StepError (exit 1, retried up to recover.retries from the last checkpoint), as the stop after
MAX_SKIPPED_IN_A_ROW NaN gradient norms (rlkit.trainer.skipped_steps): a judge server that was down, or a file
system that failed an import, may be back for the retry (whose reward workers start afresh), and each retry costs
at most MAX_FAILING_STEPS steps. A deterministic mistake (an import error in the function) fails the retries the
same way, a few short steps each, and the error says what to fix.

Checked by trainer rank 0 once per step right after the batch arrived (rlkit.jobs.grpo.rank0.Rank0.next_batch),
which grpo, opmd, ppo and distill all pass through. The counts are those of every call since the previous step,
evaluation's and the next batches' (async training) included: the same function scores them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.served_models import served_auxiliary_models
from rlkit.errors import StepError
from rlkit.rewards.builtin import BUILTINS
from rlkit.rewards.mix import RewardMix, RewardScorer
from rlkit.rewards.model_reward import REWARD_MODEL
from rlkit.rewards.runner import RewardRunner, plain

# Steps in a row in which a function failed on every call before the trainer stops: 1 would stop a run for one bad
# batch (a judge restarting, a burst of timeouts), many would train for long on zeros; 3 steps are minutes of
# rollouts, and the warning at the first one says it in the log.
MAX_FAILING_STEPS = 3
_ERROR_CHARS = 300




@dataclass
class _Watch:
    """One reward function's calls as last seen, and its steps failed in a row."""

    spec: str  # as the config names it
    setting: str  # reward.fn or reward.fns
    runner: RewardRunner
    succeeded_seen: int = 0
    failed_seen: int = 0
    in_a_row: int = 0
    calls_in_a_row: int = 0


class FailingRewards:
    """Counts, per reward function, the steps in a row in which it failed on every call; `check` once per step."""

    def __init__(self, scorer: RewardScorer, config: ExperimentConfig) -> None:
        self.config = config
        if isinstance(scorer, RewardMix):
            self.watches = [_Watch(t.spec, "reward.fns", t.runner) for t in scorer.terms]
        else:
            self.watches = [_Watch(config.reward.fn.strip(), "reward.fn", scorer)]

    def check(self) -> None:
        """After a step's batch arrived: a warning for a function's first step failed throughout, StepError at the
        MAX_FAILING_STEPS-th in a row (the first such function)."""
        for watch in self.watches:
            runner = watch.runner
            succeeded, failed = runner.succeeded, runner.errors + runner.timeouts
            new_ok, new_failed = succeeded - watch.succeeded_seen, failed - watch.failed_seen
            watch.succeeded_seen, watch.failed_seen = succeeded, failed
            if new_ok > 0:
                watch.in_a_row = watch.calls_in_a_row = 0
            elif new_failed > 0:
                watch.in_a_row += 1
                watch.calls_in_a_row += new_failed
                self._act(watch, new_failed)

    def _act(self, watch: _Watch, calls: int) -> None:
        error = plain(watch.runner.last_error or "no error text", _ERROR_CHARS)
        if watch.in_a_row >= MAX_FAILING_STEPS:
            raise StepError(f"the reward function {watch.spec} ({watch.setting}) failed on every call for "
                            f"{watch.in_a_row} steps in a row ({watch.calls_in_a_row} calls, each scored 0.0: "
                            f"nothing to learn from it); its last error: {error}. Check {self._what_to_check(watch)}")
        if watch.in_a_row == 1:
            print(f"rlkit train: WARNING: the reward function {watch.spec} ({watch.setting}) failed on all {calls} "
                  f"of its calls since the last step, each scored 0.0: {error}; {MAX_FAILING_STEPS} such steps in "
                  "a row stop the trainer", flush=True)

    def failed_throughout(self) -> str | None:
        """What to say when a function failed on every one of its calls so far (at least one), None when each
        succeeded at least once: a run that scores once (job type generate) has no later step to wait for."""
        for watch in self.watches:
            runner = watch.runner
            failed = runner.errors + runner.timeouts
            if runner.succeeded == 0 and failed > 0:
                error = plain(runner.last_error or "no error text", _ERROR_CHARS)
                return (f"the reward function {watch.spec} ({watch.setting}) failed on all {failed} of its calls, "
                        f"each scored 0.0; its last error: {error}. Check {self._what_to_check(watch)}")
        return None

    def _what_to_check(self, watch: _Watch) -> str:
        spec, reward = watch.spec, self.config.reward
        if spec == REWARD_MODEL:
            where = ("its servers, steps aux-reward_model-<i>, score it" if reward.reward_model_engine_num else
                     "its worker loads it on trainer rank 0's CPU")
            what = (f"the reward model reward.reward_model_path={reward.reward_model_path!r} (a checkpoints/final "
                    f"directory of an rw trial, or a Hugging Face sequence classifier with one label; {where})")
        elif spec in BUILTINS:
            what = (f"that the dataset's rows hold what the built-in {spec} reads "
                    f"(reward.answer_key={reward.answer_key!r})")
        else:
            what = (f"that {spec} ({watch.setting}: module.path:function) imports and runs in the job's environment "
                    "(the image's Python packages) and reads columns the dataset has")
        names = [a.name for a in served_auxiliary_models(self.config)]
        if names:
            logs = ", ".join(f"rlkit logs {self.config.trial_name} --step aux-{n}-0" for n in names)
            what += f"; if it calls an auxiliary model ({', '.join(names)}), that its servers answer ({logs})"
        return what + "; the trainer's log shows the first failed calls' errors"
