"""Plan (pure): a validated config -> the components and steps of ONE Slurm job (heterogeneous when it has servers).

The job type (rlkit.jobs) says which components there are: the inference servers first when it has any, then one
component per auxiliary model (rlkit.config.schema.auxiliary), then its work component, a trainer or (for job types
without training) a GPU-less client, always last. Each server is its own `srun` step (its own log, its own restart);
the trainer/client is one step. Each component carries its supervision policy (`ComponentPolicy`), which the job
script reads from a table instead of knowing roles. Everything the render step needs is decided here, so the
rendered text holds no logic of its own.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from dataclasses import dataclass, field

from rlkit.checks.binds import container_binds
from rlkit.config.allocation import Allocation
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.served_models import ENGINE_NUM_FIELD, auxiliary_field, served_auxiliary_models, serves_reward_model
from rlkit.errors import ConfigError
from rlkit.jobs import job_type_for
from rlkit.launch.placement import Demand, Placement, Slot, choose_placement
from rlkit.nameresolve.servers import server_step_name
from rlkit.servers.backend import backend_for, server_model
from rlkit.servers.engine_env import parse_env_vars
from rlkit.slurm.hostlist import expand_hostlist
from rlkit.slurm.time_limits import format_slurm_time, slurm_time_seconds
from rlkit.trials.paths import TrialPaths

SERVER_ROLE = "server"
AUXILIARY_ROLE = "auxiliary"  # the servers of one auxiliary model
TRAINER_ROLE = "trainer"
CLIENT_ROLE = "client"
SHARED_ROLE = "shared"  # the one node request of a packed job (every role's steps on its nodes)


@dataclass(frozen=True)
class ComponentPolicy:
    """How the job script supervises the steps of one component (its policy table, rlkit.launch.render).

    `work`: the job is done once every work step finished; the other steps (servers) are then stopped. `restart`:
    "on-exit" restarts a step whenever it exits while the job runs (a server), "on-failure" after a failure unless
    no training step finished since its last restart (the trainer), "never"; restarts end after recover.retries.
    `reports_state`: its steps write the step_state the requeue and stop decisions read (rlkit.step_contract)."""

    work: bool
    restart: str
    reports_state: bool


SERVER_POLICY = ComponentPolicy(work=False, restart="on-exit", reports_state=False)
ROLE_POLICIES = {
    SERVER_ROLE: SERVER_POLICY,
    AUXILIARY_ROLE: SERVER_POLICY,  # an auxiliary model's servers live and restart as the policy's do
    TRAINER_ROLE: ComponentPolicy(work=True, restart="on-failure", reports_state=True),
    CLIENT_ROLE: ComponentPolicy(work=True, restart="never", reports_state=False),
}


@dataclass(frozen=True)
class Component:
    """One component of the heterogeneous job (one `#SBATCH hetjob` block); `name`: which auxiliary model."""

    role: str
    nodes: int
    ntasks_per_node: int
    gpus_per_node: int
    cpus_per_task: int
    mem_per_node_mb: int
    nodelist: str = ""
    name: str = ""

    @property
    def policy(self) -> ComponentPolicy:
        return ROLE_POLICIES[self.role]

    @property
    def label(self) -> str:
        """The role, with the auxiliary model's name ("auxiliary judge"), for messages."""
        return f"{self.role} {self.name}" if self.name else self.role


@dataclass(frozen=True)
class Step:
    """One `srun [--het-group]` step: where it runs, with what, and what it runs (`het_group`: its component)."""

    name: str
    role: str
    het_group: int
    nodes: int
    ntasks: int
    gpus_per_node: int
    cpus_per_task: int
    mem_mb: int
    relative_node: int | None
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    image: str
    log: str

    @property
    def job_nodes(self) -> range:
        """The job's nodes (counted from the first) this step runs on; from node 0 when not placed (a het step)."""
        first = self.relative_node or 0
        return range(first, first + self.nodes)


@dataclass(frozen=True)
class JobPlan:
    """Everything about the job that is decided before rendering."""

    job_name: str
    trial_dir: str
    batch_log: str
    components: tuple[Component, ...]
    steps: tuple[Step, ...]
    job_options: tuple[str, ...]
    component_options: tuple[str, ...]
    container_type: str
    apptainer_args: tuple[str, ...]
    binds: tuple[str, ...]
    srun_args: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())
    retries: int = 0  # restarts of a failed trainer/server step in the allocation, and self-requeues
    attempt: int = 1  # 1 for `rlkit submit`, then one more per `rlkit resume`
    trainer_group: int = 0  # the component whose steps Slurm's time-limit warning goes to (the work component)
    shared: Component | None = None  # a packed job's one node request (rlkit.launch.placement); None: heterogeneous

    @property
    def packed(self) -> bool:
        """One allocation whose steps share nodes, instead of one het component per role."""
        return self.shared is not None

    @property
    def requests(self) -> tuple[Component, ...]:
        """What the #SBATCH blocks ask for: each component (heterogeneous), or the one shared request."""
        return (self.shared,) if self.shared is not None else self.components


def _rlkit_argv(python: str, *args: str) -> tuple[str, ...]:
    return (python, "-m", "rlkit", *args)


@dataclass(frozen=True)
class _Servers:
    """What sets one group of inference servers apart: the policy's or one auxiliary model's."""

    role: str
    name: str  # the auxiliary model's name; "" for the policy's servers
    backend: str
    model: str
    dp: int  # how many servers
    tp: int  # GPUs per server
    sized_by: str  # the field that set dp and tp, for messages

    @property
    def note(self) -> str:
        """The plan's line about them (a comment in the job script)."""
        does = f"serve auxiliary model {self.name}: {self.model}" if self.name else f"load {self.model}"
        return f"{self.dp} {self.backend} server(s) of {self.tp} GPU(s) {does}"


def _server_groups(config: ExperimentConfig, allocation: Allocation) -> list[_Servers]:
    """The policy's servers when allocation_mode has them, then one group per auxiliary model."""
    groups = []
    if allocation.server is not None:
        server = allocation.server
        model = server_model(config, server.backend)
        if not model:
            field_name = backend_for(server.backend).model_field
            raise ConfigError(f"no model for the servers: {field_name} and actor.path are both empty",
                              hint=f"set actor.path (or {field_name}) to a Hugging Face model directory")
        groups.append(_Servers(SERVER_ROLE, "", server.backend, model, server.dp, server.tp,
                               f"allocation_mode '{config.allocation_mode}'"))
    for entry in served_auxiliary_models(config):
        groups.append(_Servers(AUXILIARY_ROLE, entry.name, entry.backend, entry.model_path, entry.engine_num,
                               entry.tensor_parallel_size,
                               f"{auxiliary_field(config, entry.name, 'engine_num')} ({entry.name})"))
    return groups


def _demands(config: ExperimentConfig, allocation: Allocation, server_groups: list[_Servers]) -> list[Demand]:
    """What each component needs of the nodes' GPUs, in the plan's order (servers, auxiliary models, work)."""
    demands = [Demand(f"auxiliary {g.name}" if g.name else "server", g.dp, g.tp, block=False, where=g.sized_by)
               for g in server_groups]
    where = f"allocation_mode '{config.allocation_mode}'"
    if allocation.trainer is not None:
        demands.append(Demand(TRAINER_ROLE, allocation.trainer.gpus, 1, block=True, where=where))
    else:
        demands.append(Demand(CLIENT_ROLE, 1, 0, block=True, where=where))
    return demands


def _server_component(config: ExperimentConfig, servers: _Servers, nodes: int) -> Component:
    """The nodes of one group of servers, each server on one node; sized per GPU like every server."""
    launcher, tp = config.launcher, servers.tp
    gpn = min(servers.dp * tp, config.cluster.n_gpus_per_node)
    return Component(servers.role, nodes, gpn // tp, gpn, tp * launcher.inference_server_cpus_per_gpu,
                     gpn * launcher.inference_server_mem_per_gpu, name=servers.name)


def _work_component(config: ExperimentConfig, slot: Slot, trainer: bool) -> Component:
    """The trainer's nodes (its ranks, one GPU each), or the GPU-less client's one node."""
    launcher = config.launcher
    if not trainer:
        return Component(CLIENT_ROLE, 1, 1, 0, launcher.client_cpus, launcher.client_mem)
    return Component(TRAINER_ROLE, slot.nodes, slot.gpus_per_node, slot.gpus_per_node, launcher.trainer_cpus_per_gpu,
                     slot.gpus_per_node * launcher.trainer_mem_per_gpu)


def _server_steps(config: ExperimentConfig, paths: TrialPaths, python: str, servers: _Servers,
                  component: Component, group: int, slots: tuple[Slot, ...]) -> list[Step]:
    """The steps of one server component: the policy's servers (server-<i>), or an auxiliary model's
    (aux-<name>-<i>, `rlkit serve --auxiliary NAME`), each on the node its slot gives (within the component, or
    within the job when packed)."""
    env = tuple(sorted(parse_env_vars("launcher.inference_server_env_vars",
                                      config.launcher.inference_server_env_vars).items()))
    steps = []
    for i, slot in enumerate(slots):
        name = server_step_name(i, servers.name)
        extra = ("--auxiliary", servers.name) if servers.name else ()
        steps.append(Step(
            name=name, role=servers.role, het_group=group, nodes=1, ntasks=1, gpus_per_node=servers.tp,
            cpus_per_task=component.cpus_per_task, mem_mb=servers.tp * config.launcher.inference_server_mem_per_gpu,
            relative_node=slot.first_node,
            argv=_rlkit_argv(python, "serve", "--trial-dir", str(paths.root), "--index", str(i), *extra),
            env=env, image=config.launcher.slurm.inference_server_image, log=str(paths.step_log(name)),
        ))
    return steps


def _shared_request(placement: Placement, steps: list[Step], nodelist: str) -> Component:
    """The one node request of a packed job: on every node, the most GPUs, CPUs and memory its steps take on any
    one node (the steps then take their own slices with --exact)."""
    gpus, cpus, mem = ([0] * placement.nodes for _ in range(3))
    for step in steps:
        for node in step.job_nodes:
            gpus[node] += step.gpus_per_node
            cpus[node] += step.ntasks // step.nodes * step.cpus_per_task
            mem[node] += step.mem_mb
    return Component(SHARED_ROLE, placement.nodes, 1, max(gpus), max(cpus), max(mem), nodelist=nodelist)


def _placement_notes(placement: Placement, steps: list[Step]) -> list[str]:
    """The script's lines about a packed placement: why, and each step's nodes and GPU slice."""
    notes = [f"placement: packed, one allocation of {placement.nodes} node(s): {placement.why}; each step on its "
             "node(s) with its own GPUs:"]
    for step in steps:
        nodes = step.job_nodes
        where = f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {nodes[0]}-{nodes[-1]}"
        notes.append(f"  {step.name}: {where}, {step.gpus_per_node} GPU(s) per node, {step.ntasks} task(s)")
    return notes


def plan_job(config: ExperimentConfig, allocation: Allocation, *, python: str | None = None,
             attempt: int = 1) -> JobPlan:
    """Turn a validated config and its parsed allocation_mode (rlkit.checks.experiment.Validated.allocation) into a
    JobPlan; raises ConfigError when the layout does not fit the cluster (rlkit.launch.placement decides how the
    steps sit on nodes)."""
    mode = config.allocation_mode
    job = job_type_for(config.type)
    alloc = allocation
    cluster, launcher, slurm = config.cluster, config.launcher, config.launcher.slurm
    paths = TrialPaths.of(cluster.fileroot, config.experiment_name, config.trial_name)
    in_container = slurm.container_type == "apptainer"
    python = launcher.python or python or ("python3" if in_container else sys.executable)
    if (alloc.server is not None) != job.needs_servers or (alloc.trainer is not None) != job.trainer:
        raise ConfigError(f"allocation_mode '{mode}' does not give job type {job.name} its components",
                          hint="rlkit.checks.experiment reports what to change")  # validate refuses this first

    notes = [f"job type {job.name}: {job.help}"]
    server_groups = _server_groups(config, alloc)
    what = f"allocation_mode '{mode}'" + (" with auxiliary_models" if config.auxiliary_models else "") + \
        (f" with {ENGINE_NUM_FIELD}" if serves_reward_model(config) else "")
    placement = choose_placement(_demands(config, alloc, server_groups), cluster.n_nodes, cluster.n_gpus_per_node,
                                 what=what)
    work_group = len(server_groups)
    components = [
        _server_component(config, servers, len({s.first_node for s in placement.slots[g]}) if placement.packed
                          else placement.component_nodes[g])
        for g, servers in enumerate(server_groups)]
    components.append(_work_component(config, placement.slots[work_group][0], job.trainer))
    notes += [servers.note for servers in server_groups]
    if alloc.trainer is not None:
        notes.append(f"{alloc.trainer.dp} {alloc.trainer.backend} trainer rank(s), one GPU each")
    if not placement.packed:
        components = _split_nodelist(components, slurm.nodelist)

    steps = [step for group, servers in enumerate(server_groups)
             for step in _server_steps(config, paths, python, servers, components[group], group,
                                       placement.slots[group])]
    trainer_env = _trainer_env(config)
    last = components[work_group]
    steps.append(Step(
        name=job.name, role=last.role, het_group=work_group, nodes=last.nodes,
        ntasks=last.nodes * last.ntasks_per_node, gpus_per_node=last.gpus_per_node, cpus_per_task=last.cpus_per_task,
        mem_mb=last.mem_per_node_mb,
        relative_node=placement.slots[work_group][0].first_node if placement.packed else None,
        argv=_rlkit_argv(python, "train" if job.trainer else "client", "--trial-dir", str(paths.root)),
        env=trainer_env, image=slurm.trainer_image, log=str(paths.step_log(job.name)),
    ))
    shared = None
    if placement.packed:
        shared = _shared_request(placement, steps, _checked_nodelist(slurm.nodelist, placement.nodes))
        notes += _placement_notes(placement, steps)

    time = format_slurm_time(slurm_time_seconds(slurm.time)) if slurm.time else ""
    component_options = tuple(
        f"--{name}={value}"
        for name, value in (("partition", slurm.partition), ("account", slurm.account), ("qos", slurm.qos),
                            ("time", time), ("constraint", slurm.constraint), ("exclude", slurm.exclude))
        if value
    )
    user_binds, added_binds = container_binds(config)  # checked by validation (rlkit.checks.binds)
    binds = [b.text() for b in (*user_binds, *added_binds)]
    recovers = job.resumable and config.recover.mode != "disabled"
    job_options = list(shlex.split(slurm.sbatch_additional_args))
    if recovers:  # the trainer checkpoints on Slurm's warning and the job requeues itself (rlkit.launch.render)
        job_options += ["--requeue", f"--signal=B:USR1@{config.recover.time_limit_warning}", "--open-mode=append"]
    return JobPlan(
        job_name=f"{config.experiment_name}_{config.trial_name}",
        trial_dir=str(paths.root),
        batch_log=str(paths.batch_log),
        components=tuple(components),
        steps=tuple(steps),
        job_options=tuple(job_options),
        component_options=component_options,
        container_type=slurm.container_type,
        apptainer_args=tuple(shlex.split(slurm.apptainer_args)),
        binds=tuple(binds) if in_container else (),
        srun_args=tuple(shlex.split(slurm.srun_additional_args)),
        notes=(*notes,
               *(f"bound into containers: {b.text()}" for b in added_binds if in_container)),
        retries=config.recover.retries if recovers else 0,
        attempt=attempt,
        trainer_group=work_group,
        shared=shared,
    )


def _trainer_env(config: ExperimentConfig) -> tuple[tuple[str, str], ...]:
    """launcher.trainer_env_vars, and for a trainer that broadcasts weights CUDA_MODULE_LOADING=EAGER unless the
    user set it: CUDA's default lazy loading loads a kernel at its first launch, which waits for the whole device, so
    behind a stuck NCCL broadcast the host hangs before the link's deadline can fire (measured on an H200:
    bench/gpu_nccl_deadline.py; NCCL's own guidance for kernels launched beside its collectives)."""
    env = parse_env_vars("launcher.trainer_env_vars", config.launcher.trainer_env_vars)
    if config.actor.weight_update_mode == "xccl":
        env.setdefault("CUDA_MODULE_LOADING", "EAGER")
    return tuple(sorted(env.items()))


def _checked_nodelist(nodelist: str, needed: int) -> str:
    """launcher.slurm.nodelist for a packed job: exactly the nodes it needs."""
    if not nodelist:
        return ""
    try:
        hosts = expand_hostlist(nodelist)
    except ValueError as exc:
        raise ConfigError(f"launcher.slurm.nodelist '{nodelist}': {exc}", hint="e.g. gpu[01-04],gpu07") from None
    if len(hosts) != needed:
        raise ConfigError(f"launcher.slurm.nodelist names {len(hosts)} nodes but the job needs exactly {needed}",
                          hint=f"list {needed} nodes, or use launcher.slurm.exclude instead")
    return ",".join(hosts)


def _split_nodelist(components: list[Component], nodelist: str) -> list[Component]:
    """Give each component its slice of launcher.slurm.nodelist, in order (servers, auxiliary models, the
    trainer)."""
    if not nodelist:
        return components
    try:
        hosts = expand_hostlist(nodelist)
    except ValueError as exc:
        raise ConfigError(f"launcher.slurm.nodelist '{nodelist}': {exc}", hint="e.g. gpu[01-04],gpu07") from None
    needed = sum(c.nodes for c in components)
    if len(hosts) != needed:
        raise ConfigError(
            f"launcher.slurm.nodelist names {len(hosts)} nodes but the job needs exactly {needed}",
            hint=f"list {needed} nodes (servers take the first ones, then auxiliary models, then the trainer), or "
                 "use launcher.slurm.exclude instead",
        )
    out: list[Component] = []
    start = 0
    for c in components:
        out.append(dataclasses.replace(c, nodelist=",".join(hosts[start:start + c.nodes])))
        start += c.nodes
    return out
