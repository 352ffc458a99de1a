"""Confidence-scheduled verification: decisions only (schedulers, calibration, engine profiles)."""
