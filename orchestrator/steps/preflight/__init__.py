"""The preflight step: collect each node's environment (`step`) and judge it
against the order (`checks`, with `gpu` and `links`, over `facts`)."""
