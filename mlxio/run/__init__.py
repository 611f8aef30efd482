"""A run's scaffolding, shared by the recipes: configs to flags and JSON (`config`, `flags`), the
run's start and resume (`context`), the loop's cadence (`loop`), checkpoints (`checkpoint`,
`best`, `atomic`), metrics and logs (`reporting`, `runlog`, `phases`, `outcome`), data
parallelism (`distributed`), memory bounds, profiling and batch sizing (`budget`, `memprof`,
`batch_sizer`, `batch_probe`)."""
