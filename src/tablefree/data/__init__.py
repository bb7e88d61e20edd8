"""Data: corpus reading, tokenizers, token shards and the training loader."""
