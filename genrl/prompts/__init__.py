"""Prompts: the training and held-out prompt sources, dataset readers (text, JSONL, CSV,
Parquet, Hugging Face) and what "held-out" means for each prompt set."""
