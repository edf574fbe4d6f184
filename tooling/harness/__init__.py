"""Tools that drive the real platform processes: the chaos harness and the benchmark."""
