"""Squatting episodes on a lease's devices: told once, stopped after a grace where the pool's policy says so."""
