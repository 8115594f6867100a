"""Embedded tiny models of the default job: a digits flow generator and a digit classifier."""

from pipelines.toy.models import (
    EMBEDDED_CLASSIFIER,
    EMBEDDED_FLOW,
    DigitClassifier,
    DigitFlowModel,
    embedded_asset_path,
    from_pixels,
    load_classifier,
    load_flow_model,
    save_model,
    to_pixels,
)
from pipelines.toy.prompts import ALL_PROMPTS, DIGIT_WORDS, TEMPLATES, parse_prompt, prompt_for

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
