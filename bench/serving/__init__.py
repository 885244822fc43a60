"""A serving load generator with SGLang ``bench_serving``'s definitions, so numbers compare.

* ``datasets``: the ``random-ids`` dataset (input/output lengths, range ratio, seed).
* ``backends``: one async request function per protocol (SGLang's native ``/generate``
  stream, OpenAI ``/v1/completions`` and ``/v1/chat/completions`` streams), each
  returning a ``RequestFuncOutput`` (TTFT, inter-token latencies, latency, tokens).
* ``metrics``: ``BenchmarkMetrics`` from the outputs (SGLang's formulas).
* ``runner``: the async benchmark (request rate, max concurrency, warmup excluded).
* ``presets``: seed 000's ``chat`` and ``summ`` scenarios, with ``--scale``.

``python -m bench.serving --help`` is the CLI.
"""
