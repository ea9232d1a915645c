"""Under `sbatch --ntasks=4` without srun, the batch script is one process with the allocation's
SLURM_NTASKS but no srun step (issue 48): extract.py extracts the whole dataset as one part and
says to use srun (it used to become part 0 of 4, leaving parts 1-3 to no one); train.py with 4
ranks configured is refused as the single process it is."""

from __future__ import annotations

import pytest

from eagle3.util.launch import LaunchError, check_external_launch, extraction_shard, launch_run_id

# what sbatch exports to its batch script: the allocation's task count, rank 0, no step id
BATCH = {"SLURM_JOB_ID": "812", "SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_JOB_NAME": "extract.sbatch"}


def test_the_batch_script_extracts_as_one_part_and_says_to_use_srun(capsys):
    assert extraction_shard(1, 0, BATCH) == (1, 0)
    out = capsys.readouterr().out
    assert "SLURM_NTASKS=4 but no SLURM_STEP_ID" in out and "srun python extract.py" in out
    assert "num_shards=4 merge=true" in out
    # the tasks srun starts in that allocation split by their rank
    assert extraction_shard(1, 0, {**BATCH, "SLURM_STEP_ID": "0", "SLURM_PROCID": "3"}) == (4, 3)
    assert extraction_shard(4, 2, BATCH) == (4, 2)  # explicit parts: the config's


def test_training_four_ranks_from_the_batch_script_is_refused_as_one_process():
    with pytest.raises(LaunchError, match=r"(?s)this is a single process.*srun --nodes 1 --ntasks-per-node 4"):
        check_external_launch(4, 1, BATCH)
    check_external_launch(1, 1, BATCH)  # one rank: the batch script is it
    assert not launch_run_id(BATCH).startswith("slurm-")  # no srun step: not a multi-rank launch id
