"""`fabricctl replay`: one workload, several schedulers, the same simulated GPUs."""
