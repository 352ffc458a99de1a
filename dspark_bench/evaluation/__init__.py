"""Suites, request records and run folders, metrics, and the regression gate."""
