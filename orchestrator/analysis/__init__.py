"""Analysis of the results store: pandas frames, comparisons, cost, baselines, regressions."""
