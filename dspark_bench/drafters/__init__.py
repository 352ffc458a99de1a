"""Drafters: one module per method, all registered by name (see :mod:`.registry`)."""

from dspark_bench.drafters import dflash, dspark, eagle3, mtp, ngram, ngram_conf, vanilla  # noqa: F401  (registration)
from dspark_bench.drafters.base import DraftContext, Drafter, Proposal, Slot
from dspark_bench.drafters.registry import DrafterError, create, drafter_class, names, register

__all__ = ["DraftContext", "Drafter", "DrafterError", "Proposal", "Slot", "create", "drafter_class", "names", "register"]
