"""Launchers' placeholder ids are never taken for a job id (torchrun's default run id is "none")."""

from __future__ import annotations

import pytest

from memq.agent.source import default_job
from memq.launcher_ids import is_placeholder, real_id


@pytest.mark.parametrize("value", ["", "none", "None", "NONE", " none ", "null", "(null)", "default", "undefined",
                                   "unknown", "n/a", "$SLURM_JOB_ID", "${SLURM_JOB_ID}", "%j", "{{ job }}", None])
def test_placeholders(value):
    assert is_placeholder(value) and real_id(value) is None


@pytest.mark.parametrize("value", ["12345", "exp-42", "none-of-the-above", "default-run-7", "j0", "0"])
def test_real_ids_kept(value):
    assert not is_placeholder(value) and real_id(value) == value


def test_default_job_skips_torchruns_placeholder():
    assert default_job({"TORCHELASTIC_RUN_ID": "none"}) == ""
    # the next launcher's id is used when the first one is a placeholder
    assert default_job({"SLURM_JOB_ID": "(null)", "TORCHELASTIC_RUN_ID": "none", "JOB_NAME": "bert-ft"}) == "bert-ft"
    assert default_job({"TORCHELASTIC_RUN_ID": "3f2a-rdzv", "JOB_NAME": "x"}) == "3f2a-rdzv"
    assert default_job({"MEMQ_JOB": "mine", "SLURM_JOB_ID": "77"}) == "mine"
