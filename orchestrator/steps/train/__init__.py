"""The training step: plan and launch the protocol (`step`) and judge what came back
(`judge`)."""
