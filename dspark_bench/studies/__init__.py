"""Experiments behind the README's numbers: benchmark, sweeps, simulation, profiles, comparisons, claims."""
