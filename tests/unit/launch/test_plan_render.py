"""Plan and render are pure: checked here without Slurm (the controller's verdict is in tests/integration)."""

from __future__ import annotations

import functools
import os
import shlex
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rlkit.config.load import load_config
from rlkit.errors import ConfigError
from rlkit.jobs.validate import validate
from rlkit.launch.plan import CLIENT_ROLE, SERVER_ROLE, TRAINER_ROLE
from rlkit.launch.render import render_script, step_command
from tests.conftest import CONFIGS, REPO, example_configs
from tests.helpers.planning import plan_of

if TYPE_CHECKING:
    from rlkit.config.schema.experiment import ExperimentConfig
    from rlkit.launch.plan import JobPlan

GOLDEN = REPO / "tests" / "golden"
# Fixed values so the golden scripts do not depend on this machine.
PINNED = ["launcher.python=/opt/rlkit/bin/python", "actor.path=/storage/models/m",
          "generate.dataset.path=/storage/data/p.jsonl", "cluster.fileroot=/storage/rlkit"]


def _command_lines(script: str) -> dict[str, str]:
    """Each step function's one command line, by function name (`cmd_x() {` / command / `}`)."""
    lines = script.splitlines()
    return {line[: -len("() {")]: lines[i + 1] for i, line in enumerate(lines) if line.startswith("cmd_")}


def _start_lines(script: str) -> list[list[str]]:
    """[name, het group, *argv] of every started step, the command parsed back the way bash will."""
    commands = _command_lines(script)
    out = []
    for line in script.splitlines():
        if line.startswith("start_step "):
            name, group, fn = shlex.split(line)[1:]
            out.append([name, group, *shlex.split(commands[fn])])
    return out


# A trainer-only job (no servers, one component).
TRAINER_ONLY = ("sft-cpu-demo", [])
GOLDEN_CASES = {p.stem: (p.stem, []) for p in CONFIGS.glob("*.yaml")}
# Three components: the policy's servers, an auxiliary judge's servers (two of four GPUs each), the trainer.
GOLDEN_CASES["grpo-judge"] = ("grpo", ["cluster.n_nodes=3", "auxiliary_models=[{name: judge, model_path: "
                                       "/storage/models/judge, engine_num: 2, tensor_parallel_size: 4}]"])
# The reward model on servers of its own (two of two GPUs each, reward.reward_model_engine_num): a third component.
GOLDEN_CASES["grpo-reward-servers"] = ("grpo", ["cluster.n_nodes=3", "reward.fn=reward_model",
                                                "reward.reward_model_path=/storage/rlkit/rm/checkpoints/final",
                                                "reward.reward_model_engine_num=2",
                                                "reward.reward_model_tensor_parallel_size=2"])
# Packed (steps share nodes): 12 server GPUs + 4 trainer GPUs on two nodes of 8 (the trainer and 4 servers on node 0,
# 8 servers on node 1); grpo-one-node and grpo-one-node-cpu-demo (every step on one node) come from configs/.
GOLDEN_CASES["grpo-12-4"] = ("grpo", ["allocation_mode=vllm:d12+fsdp:d4"])
PACKED_GOLDENS = {"grpo-12-4", "grpo-one-node", "grpo-one-node-cpu-demo"}


@functools.cache
def _golden_plans(name: str) -> tuple[tuple[ExperimentConfig, JobPlan], ...]:
    """Each config of a golden case with its plan, loaded once for the two tests below (they only read them)."""
    source, overrides = GOLDEN_CASES[name]
    return tuple((config, plan_of(config)) for config in example_configs(CONFIGS / f"{source}.yaml",
                                                                          [*PINNED, *overrides]))


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_cases_keep_their_placement(name: str) -> None:
    """Packed placement changed no existing example: every other golden is still a heterogeneous job (or a
    one-component job), each component on whole nodes of its own."""
    for _config, plan in _golden_plans(name):
        assert plan.packed == (name in PACKED_GOLDENS)
        if not plan.packed:
            assert plan.requests == plan.components and all(s.het_group < len(plan.components) for s in plan.steps)


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_rendered_scripts_match_golden(name: str) -> None:
    """Golden files; regenerate after an intended change with RLKIT_UPDATE_GOLDEN=1 and review the diff."""
    configs = [config for config, _plan in _golden_plans(name)]
    scripts = [render_script(plan) for _config, plan in _golden_plans(name)]
    for script in scripts:
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    script = "".join(f"# ---- trial {c.trial_name}\n{s}" for c, s in zip(configs, scripts, strict=True)) \
        if len(scripts) > 1 else scripts[0]  # a multi-stage run: every stage's script
    golden = GOLDEN / f"{name}.sbatch"
    if os.environ.get("RLKIT_UPDATE_GOLDEN") == "1":
        golden.write_text(script)
    assert golden.is_file(), f"no golden file {golden}: run with RLKIT_UPDATE_GOLDEN=1"
    assert script == golden.read_text(), f"rendered {name} differs from {golden} (RLKIT_UPDATE_GOLDEN=1 to accept)"


def test_grpo_layout_uses_separate_nodes_for_servers_and_trainer() -> None:
    plan = plan_of(load_config(CONFIGS / "grpo.yaml", PINNED))
    servers, trainer = plan.components
    assert (servers.role, servers.nodes, servers.ntasks_per_node, servers.gpus_per_node) == (SERVER_ROLE, 1, 4, 8)
    assert (trainer.role, trainer.nodes, trainer.ntasks_per_node, trainer.gpus_per_node) == (TRAINER_ROLE, 1, 8, 8)
    assert servers.cpus_per_task == 8 and servers.mem_per_node_mb == 8 * 32768
    server_steps = [s for s in plan.steps if s.role == SERVER_ROLE]
    assert [s.gpus_per_node for s in server_steps] == [2, 2, 2, 2]
    assert [s.relative_node for s in server_steps] == [0, 0, 0, 0]
    assert plan.steps[-1].ntasks == 8 and plan.steps[-1].argv[-3:] == ("train", "--trial-dir",
                                                                       "/storage/rlkit/gsm8k-grpo/qwen1p5b_run1")
    script = render_script(plan)
    first = _start_lines(script)[0]
    assert first[:2] == ["server-0", "0"]
    assert "apptainer" in first and "--nv" in first
    bind = first[first.index("--bind") + 1]
    assert bind.split(",") == ["/storage:/storage"]  # fileroot and name-resolve root lie under it


@pytest.mark.parametrize(("overrides", "expected"), [
    (["actor.weight_update_mode=xccl"], "EAGER"),
    (["actor.weight_update_mode=xccl", "launcher.trainer_env_vars=CUDA_MODULE_LOADING=LAZY,A=1"], "LAZY"),
    (["actor.weight_update_mode=disk"], None),
])
def test_a_broadcasting_trainer_loads_its_cuda_kernels_eagerly(overrides: list[str], expected: str | None) -> None:
    """CUDA's lazy loading blocks the host behind a stuck NCCL broadcast, outside the link's deadline (measured on an
    H200, bench/gpu_nccl_deadline.py): the trainer step of an xccl job loads eagerly unless the user says otherwise,
    and the rendered script exports it to that step alone."""
    plan = plan_of(load_config(CONFIGS / "grpo.yaml", [*PINNED, *overrides]))
    trainer = dict(plan.steps[-1].env)
    assert trainer.get("CUDA_MODULE_LOADING") == expected
    assert all("CUDA_MODULE_LOADING" not in dict(step.env) for step in plan.steps[:-1])
    if expected:
        assert f"CUDA_MODULE_LOADING={expected}" in render_script(plan)


def test_servers_spread_over_nodes_when_a_node_holds_one(generate_yaml: Path) -> None:
    plan = plan_of(load_config(generate_yaml))
    assert [c.role for c in plan.components] == [SERVER_ROLE, CLIENT_ROLE]
    assert plan.components[0].nodes == 2 and plan.components[1].gpus_per_node == 0
    assert [s.relative_node for s in plan.steps if s.role == SERVER_ROLE] == [0, 1]


def test_multi_node_servers_fill_nodes_in_order(generate_yaml: Path) -> None:
    plan = plan_of(load_config(generate_yaml, ["allocation_mode=vllm:d8t2", "cluster.n_gpus_per_node=8",
                                                "cluster.n_nodes=3"]))
    assert plan.components[0].nodes == 2 and plan.components[0].ntasks_per_node == 4
    assert [s.relative_node for s in plan.steps if s.role == SERVER_ROLE] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        # packed, the client beside server 0, still needs 4 nodes of 1 GPU
        (["allocation_mode=vllm:d4"],
         "needs 4 nodes of 1 GPU (4 server GPUs, placed 1, 1, 1, 1 per node) but cluster.n_nodes is 3"),
        (["allocation_mode=vllm:d1t9", "cluster.n_gpus_per_node=8"], "one server needs 9 GPUs but a node has 8"),
        (["allocation_mode=vllm:d1t2"], "one server needs 2 GPUs but a node has 1"),
        (["allocation_mode=vllm:d5t2", "cluster.n_gpus_per_node=4", "cluster.n_nodes=2"],
         "needs 3 nodes of 4 GPUs (10 server GPUs, placed 4, 4, 2 per node) but cluster.n_nodes is 2"),
        (["launcher.slurm.nodelist=node[1-2]"], "names 2 nodes but the job needs exactly 3"),
        (["launcher.slurm.nodelist=node[2-1]"], "goes backwards"),
    ],
)
def test_layouts_that_do_not_fit_are_refused(generate_yaml: Path, overrides: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan_of(load_config(generate_yaml, overrides))
    assert says in info.value.message
    if "cluster.n_nodes is" in says:  # the fix: the nodes the packed placement takes
        assert info.value.hint == f"set cluster.n_nodes={says.split()[1]} or use fewer GPUs"


@pytest.mark.parametrize(("overrides", "nodes", "server_nodes"), [
    (["allocation_mode=vllm:d1t3", "cluster.n_gpus_per_node=8"], 1, [0]),  # 3 GPUs do not divide a node of 8
    (["allocation_mode=vllm:d3t2", "cluster.n_gpus_per_node=4"], 2, [0, 0, 1]),  # 6 GPUs are not whole nodes of 4
    (["allocation_mode=vllm:d4", "cluster.n_nodes=4"], 4, [0, 1, 2, 3]),  # the client shares server 0's node
])
def test_layouts_that_whole_nodes_cannot_hold_share_nodes(generate_yaml: Path, overrides: list[str], nodes: int,
                                                         server_nodes: list[int]) -> None:
    """Refused before packed placement: now one allocation whose steps share nodes, the client beside server 0."""
    plan = plan_of(load_config(generate_yaml, overrides))
    assert plan.packed and plan.requests[0].nodes == nodes
    assert [s.relative_node for s in plan.steps if s.role == SERVER_ROLE] == server_nodes
    assert plan.steps[-1].role == CLIENT_ROLE and plan.steps[-1].relative_node == 0


def test_nodelist_is_split_over_components(generate_yaml: Path) -> None:
    plan = plan_of(load_config(generate_yaml, ["launcher.slurm.nodelist=gpu[07-08],cpu1"]))
    assert [c.nodelist for c in plan.components] == ["gpu07,gpu08", "cpu1"]
    assert "#SBATCH --nodelist=cpu1" in render_script(plan)


def test_slurm_options_go_to_every_component(generate_yaml: Path) -> None:
    plan = plan_of(load_config(generate_yaml, ["launcher.slurm.partition=gpu", "launcher.slurm.account=proj",
                                                "launcher.slurm.qos=high", "launcher.slurm.time=1-00:00:00",
                                                "launcher.slurm.constraint=a100", "launcher.slurm.exclude=bad1",
                                                "launcher.slurm.sbatch_additional_args=--mail-type=END"]))
    script = render_script(plan)
    for option in ("--partition=gpu", "--account=proj", "--qos=high", "--time=1-00:00:00", "--constraint=a100",
                   "--exclude=bad1"):
        assert script.count(f"#SBATCH {option}\n") == 2, option
    assert script.count("#SBATCH --mail-type=END\n") == 1


def test_weird_values_survive_the_shell(generate_yaml: Path) -> None:
    """Spaces, quotes, ';' and '$(...)' in env values, mounts and images reach the step exactly, never run."""
    value = "$(touch /tmp/rlkit-pwned) b;c 'q' \"d\""
    image = "/images/my image's;$(x).sif"
    config = load_config(generate_yaml, ["launcher.slurm.container_type=apptainer",
                                         f"launcher.slurm.inference_server_image={image}",
                                         "launcher.slurm.mount=/data dir:/data",
                                         "launcher.slurm.apptainer_args=--nv --contain"])
    config.launcher.inference_server_env_vars = f"A={value}"
    plan = plan_of(config)
    script = render_script(plan)
    command = _command_lines(script)["cmd_server_0"]
    printed = subprocess.run(["bash", "-c", "printf '%s\\n' " + command],
                             capture_output=True, text=True, check=True).stdout.splitlines()
    assert printed == _start_lines(script)[0][2:]
    assert f"A={value}" in printed and image in printed
    fileroot, model, data = config.cluster.fileroot, config.actor.path, config.generate.dataset.path
    binds = printed[printed.index("--bind") + 1].split(",")
    assert binds[0] == "/data dir:/data" and sorted(binds[1:]) == sorted(f"{p}:{p}" for p in (model, data, fileroot))
    assert not Path("/tmp/rlkit-pwned").exists()


def test_fileroot_with_shell_characters_is_refused(generate_yaml: Path) -> None:
    from tests.conftest import raise_problems

    for root in ("/tmp/a b", "/tmp/a'b", "/tmp/%j", "/tmp/$HOME", "/tmp/a;b"):
        with pytest.raises(ConfigError, match="characters Slurm"):
            raise_problems(load_config(generate_yaml, [f"cluster.fileroot={root}"]))


def test_step_command_is_bare_without_containers(generate_yaml: Path) -> None:
    plan = plan_of(load_config(generate_yaml))
    argv = step_command(plan.steps[-1], plan)
    assert argv[0] == "srun" and "--het-group=1" in argv
    assert argv[-5:] == ("-m", "rlkit", "client", "--trial-dir", f"{plan.trial_dir}")
    assert "apptainer" not in argv


def test_name_resolve_files_are_bound_into_containers(generate_yaml: Path) -> None:
    """Records in the trial directory need no bind of their own; a separate record root and etcd's TLS files do (the
    model and the dataset's directory are bound as well, at their host paths)."""
    apptainer = ["launcher.slurm.container_type=apptainer", "launcher.slurm.mount="]
    config = load_config(generate_yaml)
    fileroot, model, data = config.cluster.fileroot, config.actor.path, config.generate.dataset.path
    assert sorted(plan_of(load_config(generate_yaml, apptainer)).binds) == sorted(f"{p}:{p}" for p in (model, data,
                                                                                                       fileroot))
    files = {"etcd3_cacert": "/etc/etcd/ca.crt", "etcd3_cert": "/home/u/c.crt", "etcd3_key": "/home/u/c.key"}
    etcd = ["cluster.name_resolve.type=etcd3", *(f"cluster.name_resolve.{k}={v}" for k, v in files.items())]
    binds = plan_of(load_config(generate_yaml, [*apptainer, *etcd])).binds
    assert {f"{v}:{v}" for v in files.values()} <= set(binds)
    shared = plan_of(load_config(generate_yaml, [*apptainer, "cluster.name_resolve.nfs_record_root=/shared/nr"])).binds
    assert "/shared/nr:/shared/nr" in shared


def test_trainer_only_job_has_one_component_and_no_server_steps() -> None:
    """sft: allocation_mode fsdp:d2 gives a plain (not heterogeneous) job of one trainer component and one step."""
    source, overrides = TRAINER_ONLY
    plan = plan_of(load_config(CONFIGS / f"{source}.yaml", [*PINNED, *overrides]))
    (trainer,) = plan.components
    assert (trainer.role, trainer.nodes, trainer.ntasks_per_node, trainer.gpus_per_node) == (TRAINER_ROLE, 2, 1, 1)
    (step,) = plan.steps
    assert (step.name, step.role, step.het_group, step.ntasks) == ("sft", TRAINER_ROLE, 0, 2)
    assert step.argv[-3:-1] == ("train", "--trial-dir")
    assert plan.trainer_group == 0 and plan.retries == 3  # resumable: requeues itself at its time limit
    assert "--requeue" in plan.job_options
    script = render_script(plan)
    assert "hetjob" not in script and "--het-group" not in script and "TRAINER_GROUP=0 " in script
    assert "NODE_CHECKS=(node_check_0)  #" in script  # the node check runs on the one component
    assert [line[:2] for line in _start_lines(script)] == [["sft", "0"]]
    assert not any(s.role == SERVER_ROLE for s in plan.steps)


def test_time_limit_warning_and_stop_reach_a_plain_job() -> None:
    """Outside a heterogeneous job there are no SLURM_JOB_ID_HET_GROUP_* variables: the script's component list
    falls back to the job itself, so stop and the time-limit warning still reach the trainer (run in bash here)."""
    source, overrides = TRAINER_ONLY
    script = render_script(plan_of(load_config(CONFIGS / f"{source}.yaml", [*PINNED, *overrides])))
    start = script.index("component_ids() {")
    function = script[start:script.index("\n}\n", start) + 3]
    run = subprocess.run(["bash", "-c", function + "component_ids"], capture_output=True, text=True, check=True,
                         env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "41"})
    assert run.stdout.split("\n")[:1] == ["0 41"]
    het = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "50", "SLURM_JOB_ID_HET_GROUP_0": "50",
           "SLURM_JOB_ID_HET_GROUP_1": "51"}
    run = subprocess.run(["bash", "-c", function + "component_ids"], capture_output=True, text=True, check=True,
                         env=het)
    assert sorted(run.stdout.splitlines()) == ["0 50", "1 51"]


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["allocation_mode=vllm:d2+fsdp:d2"], "job type generate has no trainer"),
        (["type=grpo"], "job type grpo needs trainer GPUs"),
        (["type=sft", "allocation_mode=vllm:d1+fsdp:d1"], "job type sft runs no inference servers"),
        (["type=sft", "allocation_mode=fsdp:d1"], None),
    ],
)
def test_layout_must_match_the_job_type(generate_yaml: Path, overrides: list[str], says: str | None) -> None:
    """validate reports a layout the job type cannot use; the planner refuses it as well if asked anyway."""
    config = load_config(generate_yaml, overrides)
    messages = [e.message for e in validate(config).problems.errors]
    if says is None:
        assert not any("allocation_mode" in m for m in messages), messages
        return
    assert any(says in m for m in messages), messages
    with pytest.raises(ConfigError, match="does not give job type"):
        plan_of(config)


def test_supervisor_and_trainer_share_the_contract(tmp_path: Path) -> None:
    """The words and codes the script acts on are rlkit.step_contract's (the training loop imports them too): a
    step_state written by the trainer's function is read back by the script's own functions (run in bash here)."""
    from rlkit.step_contract import EXIT_REQUEUE, STATUS_REQUEUE, STATUS_STOPPED, STEP_STATE, step_state_text

    source, overrides = TRAINER_ONLY
    script = render_script(plan_of(load_config(CONFIGS / f"{source}.yaml", [*PINNED, *overrides])))
    assert f"\nEXIT_REQUEUE={EXIT_REQUEUE} " in script and f"\nSTATUS_REQUEUE={STATUS_REQUEUE} " in script
    assert f"\nSTATUS_STOPPED={STATUS_STOPPED} " in script and f"\nSTEP_STATE={STEP_STATE} " in script
    start, end = script.index("trainer_status() {"), script.index("component_ids() {")
    readers = f"STEP_STATE={STEP_STATE}\n" + script[start:end]

    def read_back() -> list[str]:
        run = subprocess.run(["bash", "-c", readers + "trained_step; trainer_status"], cwd=tmp_path,
                             capture_output=True, text=True, check=False)
        assert run.stderr == "", "the batch log stays clean before the trainer wrote its first step_state"
        return run.stdout.splitlines()

    assert read_back() == ["-1"], "no step_state yet: no step, no status"
    (tmp_path / STEP_STATE).write_text(step_state_text(12, STATUS_STOPPED))
    assert read_back() == ["12", STATUS_STOPPED]
    (tmp_path / STEP_STATE).write_text(step_state_text(3, "failed: RuntimeError\nsecond line"))
    assert read_back() == ["3", "failed: RuntimeError second line"]
    (tmp_path / STEP_STATE).write_text("$(touch pwned)\n")
    assert read_back() == ["-1"] and not (tmp_path / "pwned").exists()


def test_shellcheck_passes_on_the_template_and_every_rendered_script(tmp_path: Path) -> None:
    """The supervisor template, every golden script (each stage of a multi-stage one on its own) and the repository's
    own shell scripts are clean under shellcheck (installed by scripts/dev-env.sh; a missing shellcheck fails this
    test, never skips it). The goldens are checked as one union with the template (tests/helpers/shellcheck_union.py:
    each distinct rendered line once, in its place; 18 -> ~4 CPU-s), a finding named by golden and line."""
    from rlkit.launch.render import SUPERVISOR_TEMPLATE
    from tests.helpers.shellcheck_union import union_of

    repo = REPO
    template = repo / "rlkit" / "launch" / SUPERVISOR_TEMPLATE
    shell_files = [template, *repo.glob("scripts/*.sh"), *repo.glob("slurm/*.sh")]
    goldens = {}
    for golden in sorted(GOLDEN.glob("*.sbatch")):
        for index, part in enumerate(golden.read_text().split("#!/bin/bash\n")[1:]):
            goldens[f"{golden.name}[{index}]"] = "#!/bin/bash\n" + part
    assert len(goldens) >= len(list(GOLDEN.glob("*.sbatch"))) > 3
    union = union_of(template.read_text(), goldens)
    for name, text in goldens.items():  # every rendered line is in the union, in its script's order
        lines = iter(union.lines)
        assert all(line in lines for line in text.splitlines()), name
    rendered = tmp_path / "goldens-with-the-template.sh"
    rendered.write_text(union.text)
    run = subprocess.run(["shellcheck", "--shell=bash", "--format=gcc", *map(str, shell_files), str(rendered)],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, f"{union.explain(run.stdout, str(rendered))}\n{run.stderr}"
