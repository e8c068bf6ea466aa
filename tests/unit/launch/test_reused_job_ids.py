"""Slurm reuses job ids (a wrapped MaxJobId, a controller whose state was reset): `rlkit status`, `status TRIAL` and
`logs --follow` show the state of the trial's own job, never that of a later job given its id; and a batch log path
holding a space is read whole from scontrol and compared whole. Slurm is faked on PATH with text in the shape
slurm-wlm 22.05.8 prints (`scontrol show job` of the dev cluster, trimmed)."""

from __future__ import annotations

import json
import os
import time
from io import StringIO
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlkit.cli import status
from rlkit.cli.console import console
from rlkit.launch import slurm
from rlkit.trials.paths import TrialPaths

# `scontrol show job 41` as Slurm 22.05 prints it (the one-line form, -o, joins the lines with single spaces)
SCONTROL = """\
JobId=41 JobName={name}
   UserId=u(1000) GroupId=u(1000) MCS_label=N/A
   Priority=4294901757 Nice=0 Account=(null) QOS=(null)
   JobState={state} Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   RunTime=00:03:10 TimeLimit=00:40:00 TimeMin=N/A
   Partition=debug AllocNode:Sid=localhost:3108
   NodeList=node2
   BatchHost=node2
   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   TRES=cpu=1,mem=1000M,node=1,billing=1
   Command={command}
   WorkDir=/home/u
   StdErr={stdout}
   StdIn=/dev/null
   StdOut={stdout}
   Power=
   \n"""


def one_line(text: str) -> str:
    """The -o form of a record: what Slurm joins with "\\n   " there it joins with " "."""
    return text.rstrip(" \n").replace("\n   ", " ") + " \n"


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """scontrol and sacct on PATH answering from files in the returned folder: `scontrol` (the job's record; absent:
    the controller forgot the job) and `sacct` (lines of `-P` output, oldest job first: plain `-j` answers with the
    newest, --duplicates with all)."""
    answers = tmp_path / "slurm-answers"
    bin_dir = tmp_path / "bin"
    answers.mkdir()
    bin_dir.mkdir()
    scripts = {
        "scontrol": f'[ -f {answers}/scontrol ] || {{ echo "slurm_load_jobs error: Invalid job id specified" >&2; '
                    f'exit 1; }}\ncase " $* " in *" -o "*) f=scontrol-o;; *) f=scontrol;; esac\n'
                    f'cat "{answers}/$f"\n',
        "sacct": f'[ -f {answers}/sacct ] || exit 0\ncase " $* " in *" --duplicates "*|*" -D "*) cat {answers}/sacct;; '
                 f'*) tail -n 1 {answers}/sacct;; esac\n',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return answers


def controller_has(answers: Path, *, name: str, state: str, stdout: str) -> None:
    text = SCONTROL.format(name=name, state=state, stdout=stdout, command=Path(stdout).parent.parent / "job.sbatch")
    (answers / "scontrol").write_text(text)
    (answers / "scontrol-o").write_text(one_line(text))


@pytest.fixture
def reused(rlkit_home: Path, tmp_path: Path, fake_slurm: Path) -> TrialPaths:
    """Trial exp/t, submitted as job 41, whose id the controller now gives to another job of the user (RUNNING)."""
    paths = TrialPaths(tmp_path / "runs" / "t")
    paths.logs.mkdir(parents=True)
    index = rlkit_home / "trials" / "exp"
    index.mkdir(parents=True)
    (index / "t.json").write_text(json.dumps({"experiment": "exp", "trial": "t", "trial_dir": str(paths.root),
                                              "job_id": "41", "submitted_at": 100.0}))
    controller_has(fake_slurm, name="other_job", state="RUNNING", stdout="/home/u/slurm-41.out")
    return paths


def test_the_table_and_the_detail_show_the_trial_s_recorded_end_not_the_later_job_s_state(
        reused: TrialPaths, fake_slurm: Path) -> None:
    reused.job_end.write_text("41\nCOMPLETED\n0\n1764200000\n")
    assert [row.state for row in status.all_trials()] == ["COMPLETED"]
    detail = status.trial_detail("exp/t")
    assert detail.row.state == "COMPLETED" and detail.exit_code == "0:0"
    assert detail.components == []  # the other job's node is not the trial's
    assert "is another job now (other_job)" in detail.reason and "its script's record" in detail.reason
    shown = console()
    shown.file = StringIO()
    status.print_detail(shown, detail)
    text = shown.file.getvalue()  # type: ignore[attr-defined]
    assert "COMPLETED" in text and "RUNNING" not in text and "node2" not in text, text
    # the trial's own job (its name, its log): Slurm's state, the end record unread while Slurm answers for the job
    controller_has(fake_slurm, name="exp_t", state="RUNNING", stdout=str(reused.logs / "slurm-41.out"))
    assert [(row.state, row.nodes) for row in status.all_trials()] == [("RUNNING", "node2")]


def test_without_a_record_of_its_end_the_state_is_unknown_and_says_why(reused: TrialPaths) -> None:
    assert [row.state for row in status.all_trials()] == ["UNKNOWN"]
    detail = status.trial_detail("exp/t")
    assert detail.row.state == "UNKNOWN" and detail.servers == [] and detail.slices == []
    assert detail.reason == ("Slurm's job 41 is another job now (other_job); the trial's job has ended and left no "
                             "record of its state")
    assert detail.trainer_status == ""


def test_accounting_s_record_of_the_trial_s_job_is_found_among_the_id_s_jobs(
        reused: TrialPaths, fake_slurm: Path) -> None:
    """sacct -j lists only the newest job of an id (the other one); --duplicates every one, the trial's by name."""
    (fake_slurm / "sacct").write_text("41|FAILED|1:0|00:10:00|node1|exp_t\n41|RUNNING|0:0|00:03:10|node2|other_job\n")
    row, = status.all_trials()
    assert (row.state, row.elapsed, row.nodes) == ("FAILED", "00:10:00", "node1")
    # a record of the trial's job still active beside the later job is stale (a controller reset): not believed
    (fake_slurm / "sacct").write_text("41|RUNNING|0:0|00:10:00|node1|exp_t\n41|RUNNING|0:0|00:03:10|node2|other_job\n")
    assert [row.state for row in status.all_trials()] == ["UNKNOWN"]


def _fake_clock(sleeps: list[float]) -> SimpleNamespace:
    """The time module as show_logs sees it: each monotonic() 6 s on (a job check each turn); sleep() returns at once,
    and ends a follow that never ends after 20 turns."""
    now = [0.0]

    def monotonic() -> float:
        now[0] += 6.0
        return now[0]

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) > 20:
            raise TimeoutError("logs --follow did not return")

    return SimpleNamespace(monotonic=monotonic, sleep=sleep, strftime=time.strftime, localtime=time.localtime)


def test_logs_follow_ends_when_the_id_belongs_to_another_job(
        reused: TrialPaths, fake_slurm: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (reused.logs / "slurm-41.out").write_text("step 1\n")
    sleeps: list[float] = []
    monkeypatch.setattr(status, "time", _fake_clock(sleeps))
    status.show_logs("exp/t", step=None, follow=True, lines=5)
    assert sleeps == [] and capsys.readouterr().out == "step 1\n"  # its first check of the job ended it
    # the trial's own running job is followed on
    controller_has(fake_slurm, name="exp_t", state="RUNNING", stdout=str(reused.logs / "slurm-41.out"))
    with pytest.raises(TimeoutError):
        status.show_logs("exp/t", step=None, follow=True, lines=5)
    assert len(sleeps) == 21


def test_a_batch_log_path_with_a_space_is_read_and_compared_whole(tmp_path: Path, fake_slurm: Path) -> None:
    """scontrol -o cannot tell `/runs a/...` from the pairs after it; its one-line form once cut the path at the
    space, and any job logging under `/runs <anything>` counted as the trial's."""
    trial_dir = tmp_path / "runs a" / "t"
    own_log = str(TrialPaths(trial_dir).logs / "slurm-41.out")
    controller_has(fake_slurm, name="exp_t", state="RUNNING", stdout=own_log)
    info = slurm.job_info("41")
    assert info.stdout == own_log and info.name == "exp_t" and info.state == "RUNNING"
    assert slurm.is_trials_active_job(info, "exp", "t", trial_dir)
    other_log = str(TrialPaths(tmp_path / "runs b" / "t").logs / "slurm-41.out")  # the same up to the space
    controller_has(fake_slurm, name="exp_t", state="RUNNING", stdout=other_log)
    assert slurm.job_info("41").stdout == other_log
    assert not slurm.is_trials_active_job(slurm.job_info("41"), "exp", "t", trial_dir)
    assert slurm.trials_job_info("41", "exp", "t", trial_dir).state == "UNKNOWN"


def test_both_forms_of_scontrol_s_record_parse_alike_but_for_the_path_with_a_space() -> None:
    text = SCONTROL.format(name="exp_t", state="PENDING", stdout="/r a/t/logs/slurm-41.out",
                           command="/r a/t/job.sbatch")
    record, = slurm.parse_scontrol_records(text)
    flat, = slurm.parse_scontrol_records(one_line(text))
    assert record["StdOut"] == record["StdErr"] == "/r a/t/logs/slurm-41.out"
    assert record["Command"] == "/r a/t/job.sbatch"
    assert record["Power"] == "" and record["AllocNode:Sid"] == "localhost:3108" and record["TRES"].startswith("cpu=1,")
    cut = {"StdOut", "StdErr", "Command"}
    assert flat["StdOut"] == "/r" and {k: v for k, v in flat.items() if k not in cut} == {
        k: v for k, v in record.items() if k not in cut}


def test_the_components_of_a_hetjob_are_read_from_the_default_form() -> None:
    """`scontrol show job` of a heterogeneous job: a record per component, each after a blank line."""
    text = "".join(SCONTROL.replace("JobId=41 ", f"JobId={41 + k} HetJobId=41 HetJobOffset={k} ").format(
        name="exp_t", state="RUNNING", stdout=f"/r a/t/logs/slurm-{41 + k}.out", command="/r a/t/job.sbatch") + "\n"
        for k in (0, 1))
    info = slurm.job_info_from_records("41", slurm.parse_scontrol_records(text))
    assert info.components == (("41+0", "RUNNING", "node2"), ("41+1", "RUNNING", "node2"))
    assert info.component_job_ids == ("41", "42") and info.stdout == "/r a/t/logs/slurm-41.out"


def test_a_stage_of_a_multi_stage_run_shows_its_own_job_s_end(tmp_path: Path, fake_slurm: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from rlkit.cli.status_stages import run_detail
    from rlkit.trials.records import write_manifest
    from rlkit.trials.stage_runs import StagedRun, StageRecord

    paths = TrialPaths(tmp_path / "runs" / "run_sft")
    paths.logs.mkdir(parents=True)
    write_manifest(paths, job_id="41", images={}, cwd=tmp_path)
    paths.job_end.write_text("41\nFAILED\n1\n1764200000\n")
    controller_has(fake_slurm, name="other_job", state="RUNNING", stdout="/home/u/slurm-41.out")
    run = StagedRun("exp", "run", (StageRecord("sft", "sft", "run_sft", str(paths.root)),), 100.0)
    assert [row.state for row in run_detail(run).stages] == ["FAILED"]
    controller_has(fake_slurm, name="exp_run_sft", state="RUNNING", stdout=str(paths.logs / "slurm-41.out"))
    assert [row.state for row in run_detail(run).stages] == ["RUNNING"]
    # a hand-edited manifest's id is not passed to scontrol (it would be taken as an option), and not shown as RUNNING
    paths.manifest.write_text(json.dumps({"attempts": [{"job_id": "41"}, {"job_id": "--all"}]}))
    asked: list[str] = []
    monkeypatch.setattr(slurm, "trials_job_info", lambda job_id, *_: asked.append(job_id) or slurm.JobInfo(job_id, "X"))
    assert [row.state for row in run_detail(run).stages] == ["UNKNOWN"] and asked == []
