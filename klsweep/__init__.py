"""klsweep: sweeps of KL-regularised GRPO runs on Slurm."""

__version__ = "0.1.0"
