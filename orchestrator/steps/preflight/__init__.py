"""The preflight step: collect each node's environment (`step`) and judge it
against the order (`checks`)."""
