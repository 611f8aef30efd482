"""Untrusted code (model completions) run against a problem's tests, outside this process:
`runner` (the threat model, the two-process design and `run_check` / `run_tests`), `child`
(the code each sandboxed process runs), `backend` (bubblewrap, `unshare -n` or none; the
launcher's arguments, quotas) and `seccomp` (the system-call filter)."""
