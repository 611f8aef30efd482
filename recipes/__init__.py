"""Config-as-code recipes, run as `python -m recipes.<name>`."""
