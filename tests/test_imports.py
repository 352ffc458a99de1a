"""Every module of the package imports in the test venv, optional engines included: vLLM and Ray are imported
lazily, so a broken import on those paths (e.g. a name removed from a module they use) fails here, in CI, and
not only in the vLLM venv where their tests run."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import dspark_bench

MODULES = sorted(m.name for m in pkgutil.walk_packages(dspark_bench.__path__, "dspark_bench."))


def test_the_walk_finds_the_optional_engine_modules():
    assert {"dspark_bench.engines.vllm.run", "dspark_bench.lossless.vllm", "dspark_bench.engines.native.ray"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)
