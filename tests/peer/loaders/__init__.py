"""Each framework's own config loader, executed to give the corpus's expected readings (tests/peer/corpus.py)."""
