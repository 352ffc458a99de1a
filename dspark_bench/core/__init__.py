"""Decoding math and round types: randomness, acceptance, rounds, clocks. No model, no I/O."""
