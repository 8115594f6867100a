"""One-line refusals of settings that would otherwise be ignored or misdirect the user."""

from __future__ import annotations

import pytest

from genrl import get_recipe
from genrl.config.errors import ConfigError
from loading.assets import build_command, resolve_weights


def test_a_missing_embedded_weight_names_its_own_build_script() -> None:
    with pytest.raises(FileNotFoundError, match=r"build_video_assets\.py"):
        resolve_weights(None, "video_digits/no_such_model.safetensors")
    assert build_command("countdown_lm/model.safetensors") == "python scripts/build_countdown_lm.py"
    assert build_command("digits_flow.safetensors") == "python scripts/build_assets.py"


def test_tis_cap_is_refused_where_no_sampler_log_probs_exist() -> None:
    config = get_recipe("dllm_sudoku_d1").apply_overrides(["algorithm.tis_cap=2"])
    with pytest.raises(ConfigError, match="tis_cap needs the rollout engine"):
        config.validate()
