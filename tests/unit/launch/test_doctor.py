"""The doctor's parts that run without a cluster: the table's grouping, what each node is told to run (as the job's
steps run), the checks of one node against this machine, and the all-reduce module in one real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.config.load import load_config
from rlkit.launch.doctor import node_layout, node_spec, summary_rows
from rlkit.launch.submit import prepare
from rlkit.steps.doctor_node import Check, NodeReport, _check_fileroot, _check_gpus, _check_model, first_server_node
from tests.conftest import CONFIGS, REPO, run_rlkit
from tests.helpers.planning import plan_of


def test_rows_group_passes_and_failures_by_reason() -> None:
    checks = [Check("GPUs", f"n{i}", True, "1 visible of 1 asked for") for i in range(3)]
    checks += [Check("model", "n0", True, "ok"), Check("model", "n1", False, "gone", "fix it"),
               Check("model", "n2", False, "gone", "fix it")]
    assert summary_rows(checks) == [("GPUs", "all 3 nodes", True, "1 visible of 1 asked for", ""),
                                    ("model", "n1, n2", False, "gone", "fix it")]
    assert summary_rows([Check("server start", "n0", True, "up")]) == [("server start", "n0", True, "up", "")]


def test_each_node_runs_the_checks_as_the_jobs_steps_run(grpo_yaml: Path, tmp_path: Path) -> None:
    images = [tmp_path / "t.sif", tmp_path / "s.sif"]
    for image in images:
        image.write_bytes(b"x")
    prepared = prepare(grpo_yaml, ["launcher.slurm.container_type=apptainer",
                                   f"launcher.slurm.trainer_image={images[0]}",
                                   f"launcher.slurm.inference_server_image={images[1]}",
                                   "launcher.trainer_env_vars=OMP_NUM_THREADS=1"])
    assert node_layout(prepared.plan) == (("server", "trainer", "trainer"), (1, 1, 1))
    workdir = tmp_path / "doctor" / "run1"
    workdir.mkdir(parents=True)
    spec = node_spec(prepared, workdir, "tok")
    argv = list(spec.allreduce_argv)
    assert argv[:2] == ["env", "OMP_NUM_THREADS=1"], argv
    assert argv[argv.index("apptainer"):argv.index("apptainer") + 2] == ["apptainer", "exec"]
    binds = argv[argv.index("--bind") + 1].split(",")
    assert str(workdir) in binds and str(images[0]) in argv, argv
    assert argv[-3:] == ["/opt/py/bin/python", "-m", "rlkit.steps.doctor_allreduce"]
    serve = list(spec.serve_argv)
    assert str(images[1]) in serve and serve[-4:-2] == ["-m", "rlkit.steps.doctor_serve"]
    assert (workdir / "config.yaml").stat().st_mode & 0o777 == 0o600
    assert spec.images == (str(images[1]), str(images[0])) and spec.container_type == "apptainer"
    assert spec.canary.startswith(str(tmp_path / "fileroot") + "/.rlkit-doctor-")


PINNED = ["launcher.python=/opt/rlkit/bin/python", "actor.path=/storage/models/m", "cluster.fileroot=/storage/rlkit",
          "generate.dataset.path=/storage/data/p.jsonl"]


@pytest.mark.parametrize(("source", "overrides", "layout"), [
    # the CPU demo on one node: both servers and both trainer ranks on node 0, which the job gives 4 GPUs
    ("grpo-one-node-cpu-demo", [], (("server+trainer",), (4,))),
    # 12 server GPUs and 4 trainer GPUs on two nodes of 8: servers beside the trainer on node 0, only servers on 1
    ("grpo", ["allocation_mode=vllm:d12+fsdp:d4", "cluster.n_nodes=2", "cluster.n_gpus_per_node=8"],
     (("server+trainer", "server"), (8, 8))),
    # generate on one node: the GPU-less client beside the servers
    ("generate-gpu", ["cluster.n_nodes=1"], (("server+client",), (8,))),
    # heterogeneous: one node per server, the trainer's two
    ("grpo-cpu-demo", [], (("server", "server", "trainer", "trainer"), (1, 1, 1, 1))),
])
def test_a_packed_plan_s_doctor_job_has_the_shared_request_s_nodes_and_gpus(
        source: str, overrides: list[str], layout: tuple[tuple[str, ...], tuple[int, ...]]) -> None:
    plan = plan_of(load_config(CONFIGS / f"{source}.yaml", [*PINNED, *overrides]))
    assert plan.packed == (source != "grpo-cpu-demo")
    assert node_layout(plan) == layout
    assert first_server_node(layout[0]) == 0


def test_the_server_check_runs_on_the_first_node_with_a_server() -> None:
    assert first_server_node(("trainer", "server+client", "server")) == 1
    assert first_server_node(("auxiliary+trainer", "trainer")) is None
    assert first_server_node(()) is None


def test_a_packed_config_s_doctor_spec(grpo_yaml: Path, tmp_path: Path) -> None:
    """The test config (1 server + 2 trainer ranks) on one node of 4 GPUs: one task, seeing the job's 4 GPUs, that
    runs the all-reduce and the server start."""
    prepared = prepare(grpo_yaml, ["cluster.n_nodes=1", "cluster.n_gpus_per_node=4"])
    assert prepared.plan.packed
    workdir = tmp_path / "doctor"
    workdir.mkdir()
    spec = node_spec(prepared, workdir, "tok")
    assert (spec.roles, spec.gpus) == (("server+trainer",), (3,))
    assert first_server_node(spec.roles) == 0 and spec.serve_argv and spec.allreduce_argv


def test_one_nodes_checks_on_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlkit.steps.doctor_node import NodeSpec

    canary = tmp_path / "canary"
    canary.write_text("right\n")
    spec = NodeSpec(canary=str(canary), token="right", shared_dir=str(tmp_path), roles=("trainer",), gpus=(2,),
                    model="", allreduce_argv=(), container_type="none")
    report = NodeReport("n0", "trainer")
    _check_fileroot(spec, report)
    _check_fileroot(NodeSpec(**{**spec.__dict__, "token": "other"}), report)
    _check_fileroot(NodeSpec(**{**spec.__dict__, "canary": str(tmp_path / "none")}), report)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    _check_gpus(2, report)
    _check_model(str(REPO / "nowhere"), report)
    assert [(c.name, c.ok) for c in report.checks] == [("shared fileroot", True), ("shared fileroot", False),
                                                        ("shared fileroot", False), ("GPUs", False), ("model", False)]
    assert "unreadable (No such file or directory)" in report.checks[2].detail
    assert report.checks[3].detail == ("sees 1 GPU(s) (no nvidia-smi, CUDA_VISIBLE_DEVICES=3) but its trainer "
                                       "component asked for 2"), report.checks[3]
    assert "cluster.n_gpus_per_node" in report.checks[3].fix and report.checks[0].fix == ""


def test_a_container_without_nv_has_no_gpus_whatever_slurm_says(grpo_yaml: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 0's case (rlkit.steps.node_check.gpu_shortfall): apptainer brings the driver only with --nv, so Slurm's
    CUDA_VISIBLE_DEVICES on the host proves nothing about what the job's container will see."""
    image = tmp_path / "t.sif"
    image.write_bytes(b"x")
    images = ["launcher.slurm.container_type=apptainer", f"launcher.slurm.trainer_image={image}",
              f"launcher.slurm.inference_server_image={image}"]
    workdir = tmp_path / "doctor"
    workdir.mkdir()
    without_nv = node_spec(prepare(grpo_yaml, [*images, "launcher.slurm.apptainer_args=--writable-tmpfs"]), workdir,
                           "tok")
    assert without_nv.driverless_container
    assert not node_spec(prepare(grpo_yaml, images), workdir, "tok").driverless_container  # the default: --nv
    assert not node_spec(prepare(grpo_yaml, []), workdir, "tok").driverless_container  # on the host
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    report = NodeReport("n0", "trainer")
    _check_gpus(2, report, driverless_container=False)
    _check_gpus(2, report, driverless_container=without_nv.driverless_container)
    _check_gpus(0, report, driverless_container=True)  # a GPU-less client needs no driver
    assert [c.ok for c in report.checks] == [True, False, True], report.checks
    assert report.checks[0].detail == "2 visible of 2 asked for"
    assert "no NVIDIA driver inside its trainer container" in report.checks[1].detail, report.checks[1]
    assert report.checks[1].fix == "add --nv to launcher.slurm.apptainer_args"


def test_the_allreduce_module_runs_a_real_group_of_one(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "rlkit.steps.doctor_allreduce", str(tmp_path), "0", "1"],
                          capture_output=True, text=True, timeout=120, check=False)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0 and answer["ok"] and answer["backend"] == "gloo", done
    assert (tmp_path / "allreduce-address").read_text().count(":") == 1


CODE_TOOL_CHECK = ("import json\nfrom rlkit.steps.doctor_node import NodeReport, check_code_tool\n"
                   "report = NodeReport('n', 'trainer')\ncheck_code_tool(('required', '', '/tmp'), report)\n"
                   "print(json.dumps([[c.ok, c.detail, c.fix] for c in report.checks]))")


def test_the_doctor_checks_the_code_tool_on_the_trainer_node_of_an_agent_run(grpo_yaml: Path, tmp_path: Path) -> None:
    from rlkit.steps.doctor_node import first_trainer_node

    workdir = tmp_path / "doctor"
    workdir.mkdir()
    agent = [f"rollout.agent.workflow={REPO / 'tests' / 'data' / 'agent' / 'press_workflow.py'}:episode",
             "rollout.agent.code_tool.enabled=true"]
    assert node_spec(prepare(grpo_yaml, agent), workdir, "tok").code_tool == ("required", "", "/tmp")
    assert node_spec(prepare(grpo_yaml, []), workdir, "tok").code_tool == ()
    assert first_trainer_node(("server", "trainer", "trainer")) == 1
    assert first_trainer_node(("server+trainer",)) == 0


def test_the_code_tool_check_passes_where_the_node_isolates_and_fails_with_the_fix_where_it_cannot() -> None:
    from tests.helpers.no_userns import run_without_user_namespaces

    here = subprocess.run([sys.executable, "-c", CODE_TOOL_CHECK], cwd=REPO, capture_output=True, text=True,
                          check=True)
    [[ok, detail, _]] = json.loads(here.stdout)
    assert ok and detail.startswith("full isolation"), detail
    if os.geteuid() != 0:
        return  # a node without user namespaces is made by mapping users, which needs root (CI runs as root)
    without = run_without_user_namespaces([sys.executable, "-c", CODE_TOOL_CHECK])
    assert without.returncode == 0, without.stderr
    [[ok, detail, fix]] = json.loads(without.stdout)
    assert not ok and "no namespaces (they could not be created)" in detail, detail
    assert "user.max_user_namespaces" in fix and "isolation=best_effort" in fix, fix
    from tests.helpers.old_kernel import run_without_user_notification  # before 5.0: nothing checks host FIFOs

    old = run_without_user_notification([sys.executable, "-c", CODE_TOOL_CHECK])
    assert old.returncode == 0, old.stderr
    [[ok, detail, fix]] = json.loads(old.stdout)
    assert not ok and "host FIFOs" in detail and "Landlock" in fix and "isolation=best_effort" in fix, (detail, fix)


def test_a_doctor_job_that_never_finishes_is_left_running_with_its_id_and_how_to_follow_it(
        grpo_yaml: Path, monkeypatch: pytest.MonkeyPatch, rlkit_home: Path) -> None:
    """submitit's own wait has no deadline (its sacct neither): a queue that does not move held `rlkit doctor`
    forever; now its wait ends at --wait minutes, saying the job keeps running, and the canary is removed."""
    import time

    from rlkit.errors import SlurmError
    from rlkit.launch import doctor
    from tests.helpers.submitit_fakes import QueuedForever

    job = QueuedForever()
    monkeypatch.setattr(doctor, "submit_function", lambda *args, **kwargs: job)
    said: list[str] = []
    prepared = prepare(grpo_yaml, [], dry_run=True)
    started = time.monotonic()
    try:
        with pytest.raises(SlurmError) as raised:
            doctor.run_doctor(prepared, say=said.append, wait_min=0.01)
    finally:
        job.release.set()
    assert time.monotonic() - started < 5
    assert "the doctor's job (Slurm job 4242) has not finished after 0.01 minutes" in str(raised.value)
    assert "cancel it with `scancel 4242`" in str(raised.value) and "waiting up to 0.01 minutes" in said[0]
    assert not list(Path(prepared.config.cluster.fileroot).glob(".rlkit-doctor-*")), "the canary is removed"
    result = run_rlkit("doctor", str(grpo_yaml), "--wait", "0")
    assert result.returncode == 2 and "--wait 0: must be at least 1" in result.stderr, result.stderr
