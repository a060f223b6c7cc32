"""The training step that runs on the nodes: a small GPT trained under torchrun,
checkpointed, killed and restored, with every step's loss recorded exactly.

Modules, in the order a run meets them:

- ``config``: model presets and the run configuration (standard library);
- ``probe``: ``train-probe``, where the checkpoint directory lives and whether
  other nodes see it (standard library);
- ``supervise``: ``train-supervise``, the node-local supervisor that starts
  torchrun in its own process group, samples GPU telemetry, and SIGKILLs the
  group at the chosen point (standard library);
- ``loop``: ``train``, the rank program (torch imported inside ``main``);
- ``startup``: a rank's set-up before its first step (determinism, process
  group, DDP or FSDP2, regional compile, optimizer; torch passed in);
- ``model``, ``data``, ``ckpt``: the GPT, the synthetic tokens and the
  checkpoint with its manifest (torch imported inside their functions);
- ``protocol``: the event names every part writes and reads.

Everything imported at module level here is standard library and Python 3.8
compatible: ``python3 -m payload`` imports these modules on nodes without torch.
"""
