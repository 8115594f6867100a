"""Embedded tiny models of the default job: a digits flow generator and a digit classifier."""

from loading.assets import embedded_asset_path, save_model
from pipelines.toy.models import (
    EMBEDDED_FLOW,
    DigitFlowModel,
    from_pixels,
    load_flow_model,
    to_pixels,
)
from tasks.digits import (
    ALL_PROMPTS,
    DIGIT_WORDS,
    EMBEDDED_CLASSIFIER,
    TEMPLATES,
    DigitClassifier,
    load_classifier,
    parse_prompt,
    prompt_for,
)

__all__ = [
    "ALL_PROMPTS",
    "DIGIT_WORDS",
    "EMBEDDED_CLASSIFIER",
    "EMBEDDED_FLOW",
    "TEMPLATES",
    "DigitClassifier",
    "DigitFlowModel",
    "embedded_asset_path",
    "from_pixels",
    "load_classifier",
    "load_flow_model",
    "parse_prompt",
    "prompt_for",
    "save_model",
    "to_pixels",
]
