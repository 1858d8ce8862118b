"""Supervisor: launches engines per GPU and watches the GPUs (NVML) and processes (psutil)."""
