"""gpuvet: vet rented GPU nodes and compare GPU platforms fairly."""

__version__ = "0.1.0"
