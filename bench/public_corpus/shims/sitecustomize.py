import ddpify_corpus_site  # noqa: F401  (the corpus patches: bench/public_corpus/shims/ddpify_corpus_site.py)
