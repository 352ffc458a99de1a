"""The ``dspark-bench`` command line: one module per command group."""
