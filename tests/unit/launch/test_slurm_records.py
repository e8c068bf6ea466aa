"""Reading `scontrol show job -o` records of a heterogeneous job (text in the shape Slurm 22.05 prints, trimmed)."""

from __future__ import annotations

from rlkit.launch.slurm import job_info_from_records, parse_scontrol_records

HETJOB = (
    "JobId=504 JobName=demo HetJobId=504 HetJobIdSet=504-505 HetJobOffset=0 JobState=RUNNING Reason=None "
    "ExitCode=0:0 RunTime=00:01:02 NodeList=node[1-2]\n"
    "JobId=505 JobName=demo HetJobId=504 HetJobIdSet=504-505 HetJobOffset=1 JobState=RUNNING Reason=None "
    "ExitCode=0:0 RunTime=00:01:02 NodeList=node[3-4]\n"
)


def test_a_hetjob_has_its_components_and_their_own_job_ids() -> None:
    info = job_info_from_records("504", parse_scontrol_records(HETJOB))
    assert info.state == "RUNNING" and info.nodes == "node[1-2],node[3-4]"
    assert info.components == (("504+0", "RUNNING", "node[1-2]"), ("504+1", "RUNNING", "node[3-4]"))
    # `rlkit stop` signals the trainer component by its own id: scancel 504+1 would reach every component
    assert info.component_job_ids == ("504", "505")


def test_a_plain_job_is_its_own_only_component() -> None:
    info = job_info_from_records("7", parse_scontrol_records("JobId=7 JobState=PENDING Reason=Resources NodeList=\n"))
    assert info.components == (("7", "PENDING", ""),) and info.component_job_ids == ("7",)
