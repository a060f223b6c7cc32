"""`gpuvet import poc`: recognise the files of a folder saved by hand (`files`) and judge
them as a preflight and nccl-tests run (`importer`)."""
