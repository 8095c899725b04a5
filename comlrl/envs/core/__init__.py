"""Plumbing every environment shares: the interface and registry, data loading, packaged data, baselines."""
