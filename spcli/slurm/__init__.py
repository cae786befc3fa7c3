"""Running `spcli run` as a Slurm job array.

`tasks`: which array task this process is and which shards it owns (pure functions).
`script`: the sbatch script (signal forwarding, self-requeue on exit 75), its submission, and
the per-task attempt logs a status command reads.
"""
