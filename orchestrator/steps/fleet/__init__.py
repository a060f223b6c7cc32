"""The fleet step: which node, which link (pairwise and grouped all_reduce, re-pairing,
stragglers). `plan` says who runs with whom, `localise` names suspects from the pair
table, `stragglers` reads per-rank barrier times."""
