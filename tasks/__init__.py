"""The embedded tasks, shared by the toy adapters (``pipelines/toy/``) and the rewards
(``reward_models/``): each task's prompt grammar, renderer and scoring, and ``Prompt``, the
prompt type every task and dataset produces. Imports torch, ``samplers`` and ``loading`` only."""
