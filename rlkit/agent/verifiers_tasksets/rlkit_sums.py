"""An example verifiers taskset from local data (configs/grpo-verifiers-cpu-demo.yaml, `rlkit demo verifiers`).

This directory holds modules for the verifiers venv, never imported by rlkit: rlkit puts it on the verifiers
program's PYTHONPATH, so `rollout.agent.verifiers.environment: rlkit_sums` names this module as verifiers'
`--env.taskset.id` would. A task asks for a sum; the reward is 1 when the reply holds the number, plus the reply's
length over 100, so that a random tiny model's episodes get rewards that differ within a group (GRPO learns from
the differences).
"""

import verifiers.v1 as vf

__all__ = ["SumsTaskset"]


def _reply(trace: vf.Trace) -> str:
    """The last message's text; an empty reply (the model ended its turn at once) is "", not verifiers' None, whose
    str() "None" would have scored 4 characters."""
    return str(trace.last_message.content or "")


class SumsData(vf.TaskData):
    answer: str = ""


class SumsTask(vf.Task[SumsData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(self.data.answer in _reply(trace))

    @vf.reward(weight=0.01)
    async def length(self, trace: vf.Trace) -> float:
        return float(len(_reply(trace)))


class SumsConfig(vf.TasksetConfig):
    num_tasks: int = 3


class SumsTaskset(vf.Taskset[SumsTask, SumsConfig]):
    def load(self) -> list[SumsTask]:
        return [SumsTask(SumsData(prompt=f"What is {i} + {i}?", answer=str(2 * i)), self.config.task)
                for i in range(self.config.num_tasks)]
