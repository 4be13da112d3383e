"""A module whose import fails (for `--agent tests.cli.broken_module:x`)."""

raise RuntimeError("the module's own code failed")
