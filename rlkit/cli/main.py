"""The `rlkit` command: submit, render, resume, status, stop, logs on the login node; serve, train, client in the
job (train and client run the in-job step the trial's job type names, rlkit.jobs)."""

from __future__ import annotations

import difflib
import importlib
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer
from rich.markup import escape

from rlkit.cli.console import console, mend_std_streams, write_out
from rlkit.cli.docs_cmd import docs_app
from rlkit.cli.doctor import doctor
from rlkit.cli.image import image_app
from rlkit.cli.notices import areal_notice, say_notes, warn
from rlkit.cli.version import top_options
from rlkit.errors import NO_RETRY_EXIT, SlurmError, StepError, UserError, disk_full, each_error
from rlkit.step_contract import no_retry_mark

if TYPE_CHECKING:
    pass

# markdown: help text reflows to the terminal (the default kept a docstring's source line breaks: ragged at 80)
app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                  rich_markup_mode="markdown",
                  help="Slurm-native RL post-training for LLMs. One YAML -> one heterogeneous Slurm job.")
app.add_typer(image_app, name="image")
app.callback()(top_options)
app.command("doctor")(doctor)
app.add_typer(docs_app, name="docs")
err = console(stderr=True)
out = console()
# click's usage errors as the installed typer raises them: click's own up to typer 0.2x, typer's vendored copy
# (typer._click) since typer 0.29, which no longer depends on click; typer.BadParameter is one of them in both
_USAGE_ERROR: type[Exception] = importlib.import_module(typer.BadParameter.__module__).UsageError

CONFIG_ARG = typer.Argument(..., help="Experiment YAML file.", show_default=False)
OVERRIDES_ARG = typer.Argument(None, help="Overrides as key.path=value, e.g. cluster.n_nodes=4.", show_default=False)
TRIAL_ARG = typer.Argument(..., help="experiment/trial, or a bare trial name when it is unambiguous.")


FORCE_OPT = typer.Option(False, "--force", help="Submit over an existing trial of the same name as a NEW run: the "
                         "previous run's files (recover/, checkpoints/, metrics, logs, ...) move to "
                         "`TRIAL/attempt-N/` first, so nothing is resumed from it and nothing is lost. To continue "
                         "a trial use `rlkit resume`.")


PREFLIGHT_OPT = typer.Option(True, "--preflight/--no-preflight", help="Hold the layout against the partition's "
                             "nodes and limits first (GPUs, CPUs, memory, node count, MaxTime), every mismatch at "
                             "once; --no-preflight leaves it all to sbatch --test-only.")


@app.command()
def submit(config: Path = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG, force: bool = FORCE_OPT,
           preflight: bool = PREFLIGHT_OPT) -> None:
    """Validate, plan and render the job, submit it to Slurm, and record the trial. A config with `stages:`
    submits one job per stage, each waiting for the one before (afterok)."""
    from rlkit.launch.stages import has_stages
    from rlkit.launch.submit import prepare
    from rlkit.launch.submit import submit as do_submit

    if has_stages(config):
        _submit_stages(config, overrides or [], force, preflight)
        return
    prepared = prepare(config, overrides or [], preflight=preflight)
    submitted = do_submit(prepared, force=force)
    areal_notice(prepared.areal_keys)
    say_notes(prepared.notes)
    record = submitted.record
    if submitted.archived is not None:
        out.print(f"--force: a new run; the previous run's files (recover/, checkpoints/, metrics, logs) moved to "
                  f"{submitted.archived}", markup=False)
    out.print(f"submitted [bold]{escape(record.name)}[/bold] as Slurm job {escape(str(record.job_id))}")
    out.print(f"  trial directory: {record.trial_dir}", markup=False)
    out.print(f"  follow it with:  rlkit status {record.name}   |   rlkit logs {record.name} --follow", markup=False)


def _submit_stages(config: Path, overrides: list[str], force: bool, preflight: bool) -> None:
    from rlkit.launch.stages import prepare_stages, submit_stages

    plans, _ = prepare_stages(config, overrides, preflight=preflight)
    run = submit_stages(plans, force=force)
    for plan in plans:
        say_notes(plan.prepared.notes, f"stage {plan.record.name}: ")
    out.print(f"submitted [bold]{escape(run.name)}[/bold]: {len(run.stages)} stages, each after the one before")
    for plan in plans:
        out.print(f"  stage {plan.record.name} ({plan.record.type}): trial {plan.record.trial}  "
                  f"{plan.prepared.paths.root}", markup=False)
    out.print(f"  follow it with:  rlkit status {run.name}", markup=False)


@app.command()
def resume(trial: str = typer.Argument(..., help="The trial to continue (experiment/trial or trial)."),
           overrides: list[str] = OVERRIDES_ARG) -> None:
    """Continue a stopped or failed training trial from its last recover checkpoint, as a new attempt. A
    multi-stage run continues from its first unfinished stage; the stages after it are submitted again."""
    from rlkit.launch.resume import resume_trial
    from rlkit.launch.stages import find_stage_run, resume_run

    run = find_stage_run(trial)
    if run is not None:
        for stage, job_id, how in resume_run(run, overrides or []):
            verb = "resumed from its last checkpoint" if how == "resumed" else "submitted again"
            typer.echo(f"stage {stage.name}: {verb} as Slurm job {job_id}")
        typer.echo(f"  follow it with:  rlkit status {run.name}")
        return
    record, attempt = resume_trial(trial, overrides or [])
    typer.echo(f"resumed {record.name} as Slurm job {record.job_id} (attempt {attempt})")
    typer.echo(f"  follow it with:  rlkit status {record.name}   |   rlkit logs {record.name} --follow")


@app.command()
def render(config: Path = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG,
           test_only: bool = typer.Option(False, "--test-only", help="Also ask the controller (sbatch --test-only)."),
           strict: bool = typer.Option(False, "--strict", help="Refuse missing site files (images, models, data) "
                                       "as submit does, instead of warning.")) -> None:
    """Print the sbatch script the config gives (a dry run: nothing is written or submitted). Missing site files
    are listed as warnings on stderr."""
    from rlkit.launch import slurm
    from rlkit.launch.stages import handed_over, has_stages, prepare_stages
    from rlkit.launch.submit import prepare

    if has_stages(config):
        plans, warnings = prepare_stages(config, overrides or [], dry_run=not strict)
        for plan in plans:
            write_out(f"# ---- stage {plan.record.name}: trial {plan.record.trial} "
                             + ("(afterok the stage before)" if plan is not plans[0] else "") + "\n")
            write_out("".join(f"# {key}: {path} (handed over)\n" for key, path in handed_over(plan)))
            write_out(plan.prepared.script)
            say_notes(plan.prepared.notes, f"stage {plan.record.name}: ")
        scripts = [plan.prepared.script for plan in plans]
    else:
        prepared = prepare(config, overrides or [], dry_run=not strict)
        write_out(prepared.script)
        warnings, scripts = list(prepared.warnings), [prepared.script]
        areal_notice(prepared.areal_keys)
        say_notes(prepared.notes)
    for warning in warnings:
        warn(warning.message)
    if warnings:
        err.print(f"  {len(warnings)} site file(s) missing here: `rlkit submit` refuses this config until "
                  "they exist (render --strict refuses it too)", markup=False)
    if test_only:
        for script in scripts:
            err.print(slurm.sbatch_test_only(script), markup=False)


@app.command()
def migrate(config: Path = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG) -> None:
    """Print the rlkit config an AReaL, Trinity-RFT or verl config file (or verl run script: rlkit migrate
    run_grpo.sh) becomes (overrides such as type=grpo merged in), every key rlkit has no field for listed in its
    header with what became of it. Checked as render checks."""
    from rlkit.cli.migrate_stages import has_stages, migrate_staged
    from rlkit.config.areal.migrate import migrate as migrate_file
    from rlkit.config.verl.migrate import as_rlkit_file
    from rlkit.jobs import REGISTRY
    from rlkit.launch.submit import prepare

    with as_rlkit_file(config, REGISTRY.trinity_algorithms, overrides or [],
                       REGISTRY.verl_estimators) as (source, trinity_header):
        if has_stages(source) and trinity_header:  # Trinity-RFT's stages (rlkit.config.trinity_stages)
            text, said = migrate_staged(source, overrides or [])
            write_out(trinity_header + "\n" + text)
            say_notes(tuple(said))
            return
        text, _ = migrate_file(source, overrides or [], REGISTRY)
        # the migrated text loads to this same configuration: render's own checks (layout, node count, every field)
        # refuse here what render would refuse, before the user keeps the file
        prepared = prepare(source, overrides or [], dry_run=True)
    write_out(trinity_header + text)
    for warning in prepared.warnings:
        warn(warning.message)
    say_notes(prepared.notes)


@app.command()
def status(trial: str = typer.Argument(None, help="One trial (experiment/trial or trial) for details."),
           as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Show every trial at a glance, or one trial's components, servers and failed steps."""
    from rlkit.cli import status as st

    if trial is None:
        rows = st.all_trials()
        if as_json:
            st.print_json([r.to_dict() for r in rows])
        else:
            out.print(st.trials_table(rows))
        return
    from rlkit.launch.stages import find_stage_run

    run = find_stage_run(trial)
    if run is not None:
        from rlkit.cli.status_stages import run_detail, run_table

        stages = run_detail(run)
        if as_json:
            st.print_json(stages.to_dict())
        else:
            out.print(run_table(stages))
        return
    detail = st.trial_detail(trial)
    if as_json:
        st.print_json(detail.to_dict())
    else:
        st.print_detail(out, detail)


@app.command()
def stop(trial: str = TRIAL_ARG,
         now: bool = typer.Option(False, "--now", help="Cancel at once, without the trainer's checkpoint."),
         timeout: float = typer.Option(300.0, "--timeout", help="Seconds to wait for the trainer's checkpoint.")
         ) -> None:
    """Stop the trial: a training job checkpoints first (unless --now), then every step on every node ends."""
    from rlkit.launch.stages import find_stage_run, stop_run
    from rlkit.launch.stop import stop_trial

    if not 0 <= timeout < float("inf"):  # nan, -1 and inf were taken: "up to nan s", a cancel without waiting
        raise UserError(f"stop: --timeout {timeout} is not a number of seconds to wait",
                        hint="give 0 or more seconds, e.g. --timeout 600, or --now to cancel at once")
    run = find_stage_run(trial)
    if run is not None:
        stop_run(run, now=now, timeout=timeout, say=lambda text: out.print(text, markup=False))
        return
    name = stop_trial(trial, now=now, timeout=timeout, say=lambda text: out.print(text, markup=False))
    if name is not None:
        out.print(f"cancelled the Slurm job of {name}", markup=False)


@app.command()
def logs(trial: str = TRIAL_ARG,
         step: str = typer.Option(None, "--step", help="Step name (server-0, generate, ...); default: batch log."),
         follow: bool = typer.Option(False, "--follow", "-f", help="Print new lines until the job ends."),
         lines: int = typer.Option(40, "--lines", "-n", min=0, help="How many last lines to show first.")
         ) -> None:
    """Print the last lines of a step's log (or the batch script's), optionally following it."""
    from rlkit.cli import status as st

    st.show_logs(trial, step=step, follow=follow, lines=lines)


@app.command(hidden=True)
def serve(trial_dir: Path = typer.Option(..., help="Trial directory."),
          index: int = typer.Option(..., help="Server index."),
          auxiliary: str = typer.Option("", help="Serve this auxiliary model instead of the policy.")) -> None:
    """In-job step: run one inference server and register it in name resolve."""
    from rlkit.steps.serve import run_server

    raise typer.Exit(run_server(trial_dir, index, auxiliary))


@app.command(hidden=True)
def client(trial_dir: Path = typer.Option(..., help="Trial directory.")) -> None:
    """In-job step of a job type without a trainer (generate): one GPU-less process."""
    from rlkit.jobs.run import run_job_step

    run_job_step(trial_dir, trainer=False)


@app.command(hidden=True)
def train(trial_dir: Path = typer.Option(..., help="Trial directory.")) -> None:
    """In-job step of a training job type (grpo, sft, ...): one process per trainer GPU."""
    from rlkit.jobs.run import run_job_step

    run_job_step(trial_dir, trainer=True)


@app.command()
def demo(name: str = typer.Argument("grpo", help="Which CPU example (rlkit demo --list names them)."),
         overrides: list[str] = OVERRIDES_ARG,
         listed: bool = typer.Option(False, "--list", help="Name every example and what it shows.")) -> None:
    """Run one CPU example on the dev cluster end to end: build what it reads, submit it (with the overrides),
    follow it, show its figures and where its metrics and model are."""
    from rlkit.cli.demo import main as demo_main

    rc = demo_main(["--list"] if listed else [name, *(overrides or [])])
    if rc:
        raise typer.Exit(rc)


@app.command()
def explain(key: str = typer.Argument(..., help="A config key (actor.eps_clip), a section (actor.mb_spec), a bare "
                                      "field name (mb_spec) or another system's key (data.train_batch_size).")
            ) -> None:
    """What a config key or section does: help, type, default, range, its names in AReaL, verl, Trinity-RFT,
    cosmos-rl and ChatLearn, and the job types that read it."""
    from rlkit.cli.explain import explain_lines

    for line in explain_lines(key):
        typer.echo(line)


@app.command("tiny-model")
def tiny_model(out_dir: str = typer.Argument(..., help="Directory to write the model into."),
               tied: bool = typer.Option(False, "--tied", help="Tie input and output embeddings."),
               seed: int = typer.Option(0, help="Initialisation seed.")) -> None:
    """Build a tiny tokenizer + Qwen2 model locally (no downloads) for tests and demos."""
    from rlkit.models.tiny import build_tiny_model

    fix = "give a new or existing directory you may write, e.g. /tmp/rlkit-demo/tiny-model"
    if not out_dir.strip():  # a str, not a Path: typer turns '' into Path('.'), the current directory
        raise UserError(f"tiny-model: the directory {out_dir!r} is empty, which would write the model into the "
                        "current directory", hint=fix)
    target = Path(out_dir)
    if target.exists() and not target.is_dir():
        raise UserError(f"tiny-model: '{out_dir}' is not a directory to write into", hint=fix)
    if not 0 <= seed < 2**32:
        raise UserError(f"tiny-model: --seed {seed} is out of range", hint="give a seed from 0 to 4294967295")
    try:
        built = build_tiny_model(target, tie_word_embeddings=tied, seed=seed)
    except OSError as exc:
        raise UserError(f"tiny-model: cannot write '{out_dir}': {exc.strerror or exc}", hint=fix) from None
    out.print(f"tiny model at {built}", markup=False)


def main() -> None:
    """Entry point: user mistakes exit 2 with one message, failures exit 1, never a traceback for either."""
    mend_std_streams()
    try:
        rc = app(standalone_mode=False)
    except UserError as exc:
        problems = each_error(exc)
        for problem in problems:
            err.print(f"[bold red]error:[/bold red] {escape(problem.message)}")
            if problem.hint:
                err.print(f"  [bold]fix:[/bold] {escape(problem.hint)}")
        if len(problems) > 1:
            err.print(f"{len(problems)} problems; nothing was written or submitted")
        _exit(exc.exit_code)
    except _USAGE_ERROR as exc:
        _usage_error(exc)
        _exit(2)
    except typer.Abort:
        _exit(130)
    except (SlurmError, StepError) as exc:
        err.print(f"[bold red]failed:[/bold red] {escape(str(exc))}")
        _exit(exc.exit_code)
    except Exception as exc:
        full = disk_full(exc)
        if full is None:
            raise
        err.print(f"[bold red]failed:[/bold red] {escape(full)}; free space there (or raise the quota) and run it "
                  "again (`rlkit resume` for a trial): a retry would fill it again, so none is made")
        _exit(NO_RETRY_EXIT)
    _exit(rc if isinstance(rc, int) else 0)


def _usage_error(exc: Exception) -> None:
    """A mistyped command, an unknown option, a missing argument or a bad value: one error line (click's own words,
    its "did you mean" included) and where the usage is, as rlkit's other errors print."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError":  # `rlkit` or `rlkit image` alone: the help is the message
        err.print(exc.format_message(), markup=False)  # type: ignore[attr-defined]
        return
    command = ctx.command_path if ctx is not None else "rlkit"
    message = exc.format_message()  # type: ignore[attr-defined]
    typo = re.match(r"No such command '(.+?)'", message)
    if typo and "did you mean" not in message.lower() and ctx is not None:  # click 8.1 names no close command
        close = difflib.get_close_matches(typo.group(1), ctx.command.list_commands(ctx), n=1)
        message += f" Did you mean '{close[0]}'?" if close else ""
    err.print(f"[bold red]error:[/bold red] {escape(message)}")
    err.print(f"  [bold]fix:[/bold] `{escape(command)} --help` shows the usage")


def _exit(code: int) -> NoReturn:
    """sys.exit, except in a trainer rank (`rlkit train`), which must skip interpreter teardown (see end_process). In a
    Slurm step, the no-retry code is also said in the step's log (step_contract.no_retry_mark)."""
    mark = no_retry_mark(os.environ) if code == NO_RETRY_EXIT else None
    if mark is not None:
        print(mark, file=sys.stderr, flush=True)
    dist = sys.modules.get("rlkit.trainer.dist")
    if dist is not None and dist.joined_a_process_group():
        dist.end_process(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
