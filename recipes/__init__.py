"""The entry points, one file per job, run as `python -m recipes.<name>`: each holds its config
(or imports it from `<name>_config`) and a `main(argv)` that wires the library top to bottom."""
