"""gpuvet's node-side payload.

Runs on the GPU node with the node's own python (3.8 or newer), standard
library only: ``python3 -m payload <subcommand>``. See ``payload.__main__``
for the subcommands and ``payload.commands`` for what ``collect`` runs.
"""
