"""`python -m orchestrator` runs the gpuvet CLI (where the console script is not installed)."""

from orchestrator.cli import main

main()
