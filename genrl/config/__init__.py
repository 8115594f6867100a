"""The config language every component's config is written in: ``ConfigError`` and the
nearest-key messages, dotted ``--set`` overrides parsed by each field's type, and typed reading
of saved values. It knows no component; the run's whole config, ``TrainConfig``, is in
``genrl/run/config.py``."""
