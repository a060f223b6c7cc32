"""The nccl step: build nccl-tests and run all_reduce (`step`), judge the logs into
measurements and findings (`judge`), and import logs of earlier manual runs (`importer`)."""
