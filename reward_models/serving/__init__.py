"""The reward server (``genrl serve-reward``): its front, request checks and replicas. The wire
format it speaks and the ``remote`` reward that calls it are ``reward_models/wire.py`` and
``reward_models/remote.py``, which a training run uses without the server."""
