"""Sub-commands beyond `run` and `models`; each module defines `register(app)`."""

from spcli.commands import bench, calibrate, eval, inspect, plan, slurm, status

ALL = (inspect, status, slurm, eval, bench, calibrate, plan)
