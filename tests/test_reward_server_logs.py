"""The reward server's log does not grow with its input: a request carrying a 10 MB prompt (or
a 10 MB "version") writes log lines of at most about ``LOG_FIELD_CHARS`` characters, each
saying how much was cut, whether the prompt comes back in a refusal or in a reward's traceback."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from reward_models import RewardModel
from reward_models.digits import DigitClassifierReward
from reward_models.logs import LOG_FIELD_CHARS, clip, clipped_traceback
from reward_models.wire import encode_outputs
from tests.test_reward_server_limits import post, serve  # noqa: F401 (a fixture)

TEN_MB = 10 * 2**20
# Our own words around a clipped field: the request id, the status, the count of cut characters.
OVERHEAD = 200


def test_clip_cuts_to_the_limit_and_says_how_much_was_cut() -> None:
    assert clip("x" * 10, 4) == "xxxx... [6 more characters]"
    assert clip("x" * 4, 4) == "xxxx"
    assert clip("x" * 1_000_004, 4) == "xxxx... [1,000,000 more characters]"
    assert clip("a\nforged line\r") == "a\\nforged line\\r"  # one log line, never two


def test_a_traceback_is_clipped_line_by_line() -> None:
    try:
        raise ValueError("y" * 5000)
    except ValueError as err:
        text = clipped_traceback(err, limit=100)
    assert text.splitlines()[-1] == "ValueError: " + "y" * 88 + "... [4,912 more characters]"
    assert "Traceback (most recent call last):" in text


class EchoingFailure(RewardModel):
    """A reward whose exception quotes the prompt it failed on: a 500 with a traceback."""

    name = "echoing"

    def score(self, outputs, prompts, metadata):  # type: ignore[no-untyped-def]
        raise RuntimeError(f"cannot score prompt {prompts[0]!r}")


def digit_request(prompt: str, version: object = 1) -> bytes:
    outputs = encode_outputs(torch.zeros(1, 1, 8, 8))
    return json.dumps({"version": version, "prompts": [prompt], "outputs": outputs}).encode()


CASES = {
    # digit_classifier's check_prompts quotes the prompt that names no digit: a 422
    "a 422 quoting the prompt": (DigitClassifierReward, digit_request("x" * TEN_MB), 422),
    # the reward's RuntimeError quotes it: a 500, its traceback in the log
    "a traceback quoting the prompt": (
        EchoingFailure,
        digit_request("digit 3 " + "x" * TEN_MB),
        500,
    ),
    "a 400 quoting the version": (
        DigitClassifierReward,
        digit_request("digit 3", "v" * TEN_MB),
        400,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_10_mb_field_leaves_log_lines_of_bounded_length(serve, caplog, case: str) -> None:  # noqa: F811
    caplog.set_level(logging.INFO, logger="reward_models.serving.server")
    reward, request, status = CASES[case]
    server = serve(reward(), max_prompt_bytes=2 * TEN_MB)
    got, _, reply = post(server.address, request)
    assert got == status
    assert len(reply["error"]) < LOG_FIELD_CHARS + OVERHEAD  # the reply is bounded too
    records = [r for r in caplog.records if r.name == "reward_models.serving.server"]
    assert records  # the refusal or failure was logged
    formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
    lines = [line for r in records for line in formatter.format(r).splitlines()]
    assert max(len(line) for line in lines) < LOG_FIELD_CHARS + OVERHEAD
    assert any("more characters]" in line for line in lines)  # the cut is counted
    if status == 500:
        assert any(r.exc_info for r in records)  # still a traceback, only clipped
        assert "RuntimeError: cannot score prompt 'digit 3 xxx" in caplog.text
