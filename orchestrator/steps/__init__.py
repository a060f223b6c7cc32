"""Steps: each plans commands, runs them on nodes, and returns records."""
