"""`rlkit demo NAME` (rlkit.cli.demos): every CPU example's preparation builds all its config reads, so the config
renders with no missing site file and no setting but the demo directory; the figures each run is judged by are
read from its metrics as the suite reads them. (The runs themselves are the end-to-end trials of tests/integration.)"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from rlkit.cli.demos import DEMOS, PREPARE, generate_report, prepare
from tests.conftest import CONFIGS, run_rlkit

CPU_EXAMPLES = sorted(p.name for p in CONFIGS.glob("*-cpu-demo.yaml"))


def test_every_cpu_example_is_a_demo() -> None:
    assert sorted(d.config for d in DEMOS.values()) == CPU_EXAMPLES
    assert next(iter(DEMOS)) == "grpo"  # the default, the README's demo


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("demo")
    for build in PREPARE.values():
        build(directory)
    return directory


@pytest.mark.parametrize("name", list(DEMOS))
def test_a_demos_config_renders_from_what_its_preparation_built(name: str, demo_dir: Path, tmp_path: Path) -> None:
    demo = DEMOS[name]
    before = {p: p.read_bytes() for p in demo_dir.rglob("*") if p.is_file()}
    prepare(demo, demo_dir)  # idempotent: a second preparation leaves the same files
    assert {p: p.read_bytes() for p in demo_dir.rglob("*") if p.is_file()} == before
    env = {"RLKIT_VERIFIERS_PYTHON": sys.executable,  # the verifiers demo's venv, unless built (scripts/test.sh)
           **os.environ, "RLKIT_DEMO_DIR": str(demo_dir), "RLKIT_DEMO_TRIAL": "t1"}
    rendered = run_rlkit("render", str(CONFIGS / demo.config), f"cluster.fileroot={tmp_path}", env=env)
    assert rendered.returncode == 0, rendered.stderr
    assert "warning" not in rendered.stderr, rendered.stderr  # no model, dataset or image missing


def test_the_figures_are_the_ones_each_run_is_judged_by(tmp_path: Path) -> None:
    rewards = [{"reward/mean": r} for r in (0.0, 0.1, 0.2, 0.5, 0.9, 1.0)]
    assert DEMOS["grpo"].report(rewards).endswith("first 3 steps 0.100, of the last 3 steps 0.800")  # type: ignore[misc]
    distilled = [{**r, "distill/reverse_kl": k} for r, k in zip(rewards, (7.0, 6.5, 6.0, 2.0, 1.0, 0.6), strict=True)]
    assert DEMOS["distill"].report(distilled).endswith(  # type: ignore[misc]
        "of the last 3 steps 0.800; reverse KL to the teacher 6.500 -> 1.200 nats/token")
    sft = [{"sft/loss": 3.0}, {"sft/loss": 1.0, "eval/loss": 1.5}, {"sft/loss": 0.5, "eval/loss": 0.7}]
    assert "training loss 3.000 -> 0.500; held-out loss 1.500 -> 0.700" in DEMOS["sft"].report(sft)  # type: ignore[misc]
    pairs = [{"eval/accuracy": 0.5, "eval/reward_margin": 0.0}, {"eval/accuracy": 1.0, "eval/reward_margin": 2.0}]
    assert "accuracy 0.500 -> 1.000, held-out reward margin 0.000 -> 2.000" in DEMOS["dpo"].report(pairs)  # type: ignore[misc]
    once = [{"rw/loss": 0.7}, {"rw/loss": 0.1, "eval/accuracy": 1.0, "eval/reward_margin": 2.0}]  # one epoch: rw
    assert DEMOS["rw"].report(once).endswith("held-out accuracy 1.000 (one evaluation, at the end), held-out "  # type: ignore[misc]
                                             "reward margin 2.000 (one evaluation, at the end)")
    assert "held-out loss 0.700 (one evaluation, at the end)" in DEMOS["sft"].report(sft[::2])  # type: ignore[misc]
    assert DEMOS["stages"].report(sft).startswith("3 steps; training loss")  # type: ignore[misc]
    tasks = [{**r, "reward/task/chain_sum/mean": r["reward/mean"] / 2} for r in rewards]
    assert DEMOS["rgym"].report(tasks).endswith("last 3 steps 0.800; task scores chain_sum 0.050 -> 0.400")  # type: ignore[misc]
    (tmp_path / "completions.jsonl").write_text(json.dumps({"prompt": "1+1=", "completions": [{"text": "2"}]}) + "\n")
    assert generate_report(tmp_path).endswith("the first: '1+1=' -> '2'")
    (tmp_path / "summary.json").write_text(json.dumps({"prompts": 1, "completions": 1, "reward_mean": 1.0,
                                                       "pass_at_k": {"1": 1.0}, "pass_threshold": 1.0,
                                                       "failed_calls": 0, "timed_out_calls": 0}))
    assert generate_report(tmp_path).endswith("the first: '1+1=' -> '2'; scored: 1 prompts, 1 completions: mean "
                                              "reward 1.000  pass@1 1.000 (threshold 1.0); 0 failed and 0 "
                                              "timed-out reward calls")


def test_an_unknown_demo_is_refused_naming_the_known_ones() -> None:
    result = run_rlkit("demo", "nosuch")
    assert result.returncode == 2 and "one of grpo, one-node" in result.stderr, result.stderr


def test_the_demo_directory_must_be_this_users_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared machine's /tmp: another user's demo directory (or one anyone may write) is refused, never read."""
    from rlkit.cli.demo import own_directory

    fresh = tmp_path / "new" / "demo"
    assert own_directory(fresh) is None and (fresh.stat().st_mode & 0o777) == 0o700
    (tmp_path / "link").symlink_to(fresh)
    assert "link" in str(own_directory(tmp_path / "link"))
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    assert "others may write in it (mode 777)" in str(own_directory(tmp_path / "open"))
    monkeypatch.setattr(os, "geteuid", lambda: fresh.stat().st_uid + 1)
    assert "not yours" in str(own_directory(fresh))


def test_a_demo_in_a_directory_others_may_write_is_refused_before_it_writes(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    env = {"RLKIT_DEMO_DIR": str(shared), "RLKIT_FILEROOT": str(tmp_path / "not-a-dir"), "RLKIT_DEMO_TRIAL": "t1"}
    (tmp_path / "not-a-dir").write_text("")  # should the refusal go, submit refuses this fileroot: nothing submitted
    result = run_rlkit("demo", "grpo", env=env)
    assert result.returncode == 2 and f"error: demo directory {shared}: others may write" in result.stderr, result
    assert "Traceback" not in result.stderr and list(shared.iterdir()) == []
