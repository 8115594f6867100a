"""Which extra copies of the trained weights an algorithm keeps, read from its config.

``MODEL_COPIES`` maps an algorithm's registry name to ``(reference, lagged)``:

* ``reference``: the objective or the rollout uses the frozen initial policy
  (``uses_reference`` of ``genrl/objectives/`` and ``genrl/rollouts/``); under full
  fine-tuning ``build_run`` then keeps a frozen copy of the module (``Policy.keep_reference``);
* ``lagged``: ``EndpointRollout`` samples from a lagged copy of the trainable weights
  (docs/architecture.md, section 3's table).

The rules repeat those properties because the planner builds no policy; ``tests/test_planning.py``
checks them against the built objectives of the embedded recipes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from genrl.config.errors import ConfigError


def _kl(a: Any) -> bool:
    return float(getattr(a, "kl_beta", 0.0)) > 0


MODEL_COPIES: dict[str, Callable[[Any], tuple[bool, bool]]] = {
    "flow_grpo": lambda a: (_kl(a) or float(a.kl_reward) > 0, False),
    "branch_grpo": lambda a: (_kl(a), False),
    "grpo": lambda a: (_kl(a), False),
    "exgrpo": lambda a: (_kl(a), False),
    "mask_grpo": lambda a: (_kl(a), False),
    # RAM's regression target and GDRO's implicit reward are built on the reference's output.
    "ram": lambda a: (True, True),
    "gdro": lambda a: (True, False),
    "diffusion_nft": lambda a: (_kl(a), True),
    "marble": lambda a: (_kl(a), True),
    "dgpo": lambda a: (
        a.reference == "frozen" or _kl(a),
        not (a.clip_range is None and a.reference == "frozen"),
    ),
    "awm": lambda a: (float(a.beta) > 0, float(a.lagged_beta) > 0),
}


def model_copies(algorithm: Any) -> tuple[bool, bool]:
    """``(reference, lagged)`` for an algorithm config (``config.algorithm``)."""
    rule = MODEL_COPIES.get(algorithm.name)
    if rule is None:
        raise ConfigError(
            f"genrl plan: no rule for algorithm {algorithm.name!r} in "
            f"genrl/planning/copies.py (known: {', '.join(MODEL_COPIES)})"
        )
    return rule(algorithm)
