"""The headless cache config's refusals, for the unit tests of its dataset keys (tests/unit/test_caption_options.py,
tests/unit/test_video_clip_rules.py): a config with a stand-in ComfyUI folder and one dataset folder."""
from __future__ import annotations

from pathlib import Path

import pytest


def cache_config_error(tmp_path: Path):
    """error(**dataset keys) -> the ConfigError text CacheConfig gives for those keys."""
    from PipeTrain.engine.config.cache import CacheConfig
    from PipeTrain.engine.config.checks import ConfigError

    (tmp_path / "comfy").mkdir()
    (tmp_path / "comfy" / "sd.py").write_text("")
    (tmp_path / "set").mkdir()
    base = {"comfyui_root": str(tmp_path), "dataset": {"folders": ["set"], "resolution": 64}}

    def error(**dataset) -> str:
        with pytest.raises(ConfigError) as e:
            CacheConfig.from_dict({**base, "dataset": {**base["dataset"], **dataset}}, str(tmp_path))
        return str(e.value)

    return error
