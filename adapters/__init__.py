"""Everything that touches the world: runtimes, cloud and cluster clients, the CLI, benchmarks."""
