"""GPU telemetry backends: NVML (real) and a simulator (labelled as such)."""
