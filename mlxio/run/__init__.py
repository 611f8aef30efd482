"""Run scaffolding: config parsing, metrics logs, checkpoints, distributed set-up, memory profiling, batch sizing."""
