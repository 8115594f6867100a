"""Real models on a machine without the extra or without the network: one line that says what is
missing and the ways out, quickly (``loading/hub.py``). Nothing here leaves the machine:
the hub is offline (``HF_HUB_OFFLINE``) or its endpoint is a local socket."""

from __future__ import annotations

import http.server
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import loading.hub as loading
from genrl.cli.main import main
from loading.extras import MissingExtraError, missing_extra
from loading.hub import ModelNotCachedError, require_local_or_reachable
from reward_models import CompositeReward, build_reward

MADE_UP = "made-up-org/no-such-model-0123"


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()``, failing the test instead of hanging when it takes longer than ``seconds``."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as err:
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if errors:
        raise errors[0]
    return result[0]


def _one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert _within(120, lambda: main(list(argv))) == 2
    err = capsys.readouterr().err
    assert err.startswith("genrl: error: ") and err.count("\n") == 1, err
    return err


# -- not cached, hub offline -----------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["sd3", "flow_image", "causal_lm"])
def test_uncached_model_offline_says_so_with_the_ways_out(
    policy: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    err = _one_line_error(
        capsys, "train", "--set", f"policy.name={policy}", "--set", f"policy.pretrained={MADE_UP}"
    )
    assert f"{MADE_UP} is not in the local Hugging Face cache" in err
    assert "the hub is unreachable (HF_HUB_OFFLINE is set)" in err
    assert f"`hf download {MADE_UP}`" in err and "--set policy.pretrained=DIR" in err


def test_uncached_reward_files_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    from reward_models.base import local_or_hub_file

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ModelNotCachedError, match=f"{MADE_UP}/weights.pt is not in the local"
    ) as info:
        local_or_hub_file(None, MADE_UP, "weights.pt", "hps")
    assert f"`hf download {MADE_UP} weights.pt`" in str(info.value)
    assert 'reward.0.kwargs={"checkpoint": "FILE"}' in str(info.value)
    reward = build_reward("pickscore", model=MADE_UP, processor=MADE_UP)
    with pytest.raises(ModelNotCachedError, match="'model' argument"):
        CompositeReward([(reward, 1.0)])(torch.zeros(1, 3, 8, 8), ["a cat"])


def _fake_cache(root: Path, repo: str, filename: str) -> None:
    """The layout ``huggingface_hub`` downloads into: refs/main -> snapshots/<commit>/file."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0" * 40)
    (folder / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (folder / "snapshots" / ("0" * 40) / filename).write_text("{}")


def test_cached_local_and_non_hub_names_pass_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    _fake_cache(tmp_path / "hub", MADE_UP, "model_index.json")
    require_local_or_reachable(MADE_UP, "DIR")
    require_local_or_reachable(MADE_UP, "DIR", filename="model_index.json")
    with pytest.raises(ModelNotCachedError):
        require_local_or_reachable(MADE_UP, "DIR", filename="other.pt")
    require_local_or_reachable(str(tmp_path), "DIR")  # a local directory
    require_local_or_reachable(str(tmp_path / "no" / "such" / "dir"), "DIR")  # the loader says
    require_local_or_reachable(None, "DIR")


# -- not cached, hub unreachable (a local endpoint) ----------------------------------------------------
@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Online mode with the hub endpoint at a local address (and no proxy in the way)."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for name in (
        "http_proxy",
        "https_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    yield lambda endpoint: monkeypatch.setattr(constants, "ENDPOINT", endpoint)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_refused_endpoint_fails_fast(online: Callable[[str], None]) -> None:
    endpoint = f"http://127.0.0.1:{_free_port()}"
    online(endpoint)
    with pytest.raises(ModelNotCachedError, match=f"unreachable \\({endpoint} did not answer"):
        _within(30, lambda: require_local_or_reachable(MADE_UP, "DIR"))


def test_silent_endpoint_times_out(
    online: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loading, "PROBE_TIMEOUT_S", 0.3)
    with socket.socket() as silent:  # accepts connections (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        online(f"http://127.0.0.1:{silent.getsockname()[1]}")
        with pytest.raises(ModelNotCachedError, match="did not answer"):
            _within(30, lambda: require_local_or_reachable(MADE_UP, "DIR"))


def test_answering_endpoint_lets_the_loader_download(online: Callable[[str], None]) -> None:
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(404)  # any answer means the hub is there
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        online(f"http://127.0.0.1:{server.server_address[1]}")
        _within(30, lambda: require_local_or_reachable(MADE_UP, "DIR"))
    finally:
        server.shutdown()
        server.server_close()


# -- optional libraries not installed ------------------------------------------------------------------
def test_missing_diffusers_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "diffusers", None)  # import diffusers -> ImportError
    err = _one_line_error(
        capsys, "train", "--set", "policy.name=sd3", "--set", f"policy.pretrained={MADE_UP}"
    )
    assert "policy 'sd3' needs 'diffusers', which is not installed" in err
    assert 'pip install "genrl[diffusers]"' in err


@pytest.mark.parametrize(
    ("module", "reward", "kwargs"),
    [("open_clip", "hps", {"checkpoint": "x.pt"}), ("transformers", "pickscore", {})],
)
def test_missing_reward_library_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, reward: str, kwargs: dict[str, Any]
) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    composite = CompositeReward([(build_reward(reward, **kwargs), 1.0)])
    with pytest.raises(MissingExtraError, match=f"reward '{reward}' needs '{module}'") as info:
        composite(torch.zeros(1, 3, 8, 8), ["a cat"])
    assert 'pip install "genrl[rewards]"' in str(info.value)


def test_other_import_errors_are_not_blamed_on_an_extra() -> None:
    err = ImportError("No module named 'my_plugin'", name="my_plugin")
    assert missing_extra(err, "policy 'x'", "diffusers") is None
