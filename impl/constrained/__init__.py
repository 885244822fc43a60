"""Constrained decoding: grammars (JSON schema, regex, EBNF) that mask each sampled row's logits.

* ``limits.py``: what a request's grammar source may be (sizes, depths), checked before compiling;
* ``tokenizer_info.py``: xgrammar's token table built once per engine from our tokenizer;
* ``grammar.py``: ``GrammarBackend`` (compile off the scheduler thread, cached by source) and
  ``GrammarState`` (one matcher per sequence);
* ``bitmask.py``: applying a batch of token bitmasks to logits rows (used by the sampler).
"""
