"""Running `spcli run` as a Slurm job array.

`tasks`: which array task this process is and which shards it owns (pure functions).
`script`: the sbatch script (signal forwarding, self-requeue on exit 75), its submission, and
the per-task attempt logs a status command reads.
`submit`: the checks and the record behind `spcli slurm submit`.
`query`: what squeue/sacct say about an array's tasks.
`status`: `spcli status DIR`, per task and overall, from the directory and from Slurm.
"""
