# Every target bootstraps .venv itself (torch==2.13.0 first: the CPU build on local disk).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: serve serve-cluster bench-cluster test spec lint soak bench bench-kernels bench-engine bench-yoco bench-spec bench-cpu-fused bench-detokenize gpu-check docs clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test,bench,cluster]"
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP)

serve: $(STAMP)
	$(PY) -m impl.launch_server $(ARGS)

# K workers behind sglang-router: make serve-cluster WORKERS=4 POLICY=power_of_two ARGS="--model-path DIR"
WORKERS ?= 2
POLICY ?= cache_aware
serve-cluster: $(STAMP)
	$(PY) -m impl.launch_cluster --num-workers $(WORKERS) --policy $(POLICY) -- $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q

spec: $(STAMP)
	$(PY) -m pytest spec -q

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy

# Server hardening runs too long for CI (issue 14): 64-client soak, schemathesis with its coverage
# phase, the integrity-failure server. Loopback only.
soak: $(STAMP)
	$(PY) -m pytest tests/server -m soak -q -s

docs: $(STAMP)
	$(PY) -m contracts.docs --write

bench: bench-engine bench-yoco

bench-kernels: $(STAMP)
	$(PY) -m pytest bench/kernels -m bench -q

bench-engine: $(STAMP)
	$(PY) bench/bench_engine.py

bench-cluster: $(STAMP)
	$(PY) bench/bench_cluster.py

bench-yoco: $(STAMP)
	$(PY) bench/bench_yoco.py

bench-spec: $(STAMP)
	$(PY) bench/bench_spec.py --backend torch_native
	$(PY) bench/bench_spec.py --backend triton --batch-sizes 1 --new-tokens 16 --rounds 1

bench-cpu-fused: $(STAMP)
	$(PY) bench/bench_cpu_fused.py

bench-detokenize: $(STAMP)
	$(PY) bench/bench_detokenize.py

gpu-check:
	bash scripts/gpu_check.sh

clean:
	rm -rf $(VENV) .cache .hypothesis .benchmarks
