"""What must hold before a model loads, shared by the adapters (``pipelines/``) and the rewards
(``reward_models/``): the optional library is installed, the files are local or the hub is
reachable, and where the embedded assets are. It imports neither."""
