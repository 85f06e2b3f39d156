"""Fixtures of the engine-level training tests: the demo dataset's cache (built once per test module, as each
module's runs may change what they read) and a factory of run configurations over it."""
from __future__ import annotations

import pytest

from engine_runs import build_cache, make_config


@pytest.fixture(scope="module")
def cache_dir(comfy_root, demo_base):
    return build_cache(comfy_root, demo_base)


@pytest.fixture
def config(tmp_path, comfy_root, demo_base, cache_dir):
    """config(name="run", **kw): a run configuration in tmp_path/name (engine_runs.make_config)."""
    def make(name="run", **kw):
        return make_config(tmp_path / name, comfy_root, demo_base, cache_dir, **kw)
    return make
