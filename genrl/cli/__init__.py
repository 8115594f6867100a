"""The command line (``genrl train``, ``eval``, ``list``, ``serve-reward``, ``train-probe``)."""
