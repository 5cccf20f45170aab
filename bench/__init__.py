"""Benchmarks of the queue (see bench/README.md). Not part of the package."""
