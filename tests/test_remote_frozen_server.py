"""A frozen reward server (one that accepts connections and never answers) fails
``RemoteReward`` within its patience, in one line naming the server and the seconds waited; the
defaults give up within a minute on the embedded tasks' requests and still wait out a 40 s
freeze."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from reward_models import RewardError
from reward_models.remote import RemoteReward


@pytest.fixture
def frozen_server() -> Iterator[str]:
    """A listening socket that accepts every connection, reads what comes and never replies."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                connection, _ = listener.accept()
                connection.settimeout(0.01)
                held.append(connection)
            for connection in held:  # drain, so that the client's writes never block
                with contextlib.suppress(TimeoutError, OSError):
                    connection.recv(1 << 20)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(timeout=10)
    for connection in held:
        connection.close()
    listener.close()


def test_a_frozen_server_fails_within_the_timeouts_in_one_line(frozen_server: str) -> None:
    remote = RemoteReward(
        frozen_server, name="c", timeout_s=0.3, timeout_per_sample_s=0.05, retries=1, backoff_s=0.1
    )
    assert remote.patience_s(2) == pytest.approx(2 * (0.3 + 0.1) + 0.1)
    started = time.monotonic()
    with pytest.raises(RewardError) as raised:
        remote(torch.zeros(2, 3, 4, 4), ["p", "p"])
    elapsed = time.monotonic() - started
    message = str(raised.value)
    assert "\n" not in message
    pattern = (
        rf"{re.escape(frozen_server)}/score failed 2 times in (\d+\.\d) s "
        r"\(each attempt allowed 0\.4 s; last: ReadTimeout\('timed out'\)\); "
        r"is `genrl serve-reward` running there\?"
    )
    found = re.fullmatch(pattern, message)
    assert found, message
    waited = float(found.group(1))
    assert remote.patience_s(2) - 0.05 <= waited <= elapsed < remote.patience_s(2) + 3.0


def test_the_defaults_give_up_within_a_minute_and_wait_out_a_40_s_freeze() -> None:
    remote = RemoteReward("http://127.0.0.1:1")
    assert (remote.timeout_s, remote.timeout_per_sample_s, remote.retries) == (15.0, 0.05, 2)
    # The embedded tasks send requests of at most max_batch_size (64) samples.
    assert remote.max_batch_size == 64
    assert remote.patience_s() == pytest.approx(3 * (15 + 0.05 * 64) + 1 + 2) == 57.6
    assert remote.patience_s() < 60
    # The last attempt of even a one-sample request is still waiting 40 s after the first.
    assert remote.patience_s(1) - remote.attempt_timeout_s(1) < 40 < remote.patience_s(1)
