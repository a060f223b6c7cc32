"""The health step that runs on the nodes: every GPU measured against its own physics
(memory bandwidth, matrix throughput per precision, host links, peers), its
products and memory checked, and its error counters read before and after.

Modules, in the order a run meets them:

- ``node``: ``health``, the entry point: counters, samplers, one process per GPU,
  the links process, dcgmi, the node document (standard library);
- ``counters``: the raw before/after reads (nvidia-smi, sysfs, the kernel log);
- ``sampler``: clock event reasons sampled beside the training step's dmon sampler;
- ``gpu``: ``health-gpu``, one GPU's phases (torch imported inside ``main``);
- ``links``: ``health-links``, host copies and the peer matrix (torch inside ``main``);
- ``kernels``: the torch measurements and checks both use (torch inside functions);
- ``protocol``: the file and event names, and what each level runs at which size.

Everything imported at module level here is standard library and Python 3.8
compatible: ``python3 -m payload`` imports these modules on nodes without torch.
"""
