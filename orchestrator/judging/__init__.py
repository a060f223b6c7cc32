"""Judgement shared by the steps: the record sink every judge writes through
(`sink`), GPU telemetry with its idle and throttling verdicts (`telemetry`),
whether a checkpoint directory survives the instance (`storage`), and the
InfiniBand/RoCE ports read from sysfs: counters around a load, P_Keys across
nodes, RoCE GIDs (`fabric`).

Below `orchestrator/steps/` and above records, parsers and the suite: nothing
here imports a step, the analysis or the command line.
"""
