"""Seed 004 handle_cache_compatibility: decode host pool, hierarchical cache, decode KV offload, SWA ratio (K11-K18)."""

from __future__ import annotations

from contracts.base import contract
from contracts.expect import VALUE_TYPES, must_accept, must_reject

# The options of seed 004's hook these rules are about (contracts.base.Contract.options): an engine without
# them is out of scope for these rules.
OPTIONS = (
    "--dcp-size",
    "--disable-priority-preemption",
    "--disable-radix-cache",
    "--disaggregation-decode-enable-offload-kvcache",
    "--disaggregation-decode-retraction-backup",
    "--disaggregation-mode",
    "--enable-hierarchical-cache",
    "--enable-priority-scheduling",
    "--hicache-storage-backend",
    "--swa-full-tokens-ratio",
)

SEED = "seeds/004"

FN = f"{SEED} handle_cache_compatibility"
BACKUP = "--disaggregation-decode-retraction-backup"
HOST_POOL = (BACKUP, "host_pool")
DECODE = ("--disaggregation-mode", "decode")
OFFLOAD = "--disaggregation-decode-enable-offload-kvcache"
STORAGE = ("--hicache-storage-backend", "file")


@contract(
    "HOST-POOL-PD-DECODE-ONLY", FN, rules=("K11",), options=OPTIONS,
    rule=f"{BACKUP}=host_pool is a ValueError unless --disaggregation-mode decode.",
)
def host_pool_decode_only(subject) -> None:
    for mode in ("null", "prefill"):
        must_reject(subject, (*HOST_POOL, "--disaggregation-mode", mode), (BACKUP, "host_pool", "decode"), types=VALUE_TYPES)
    must_accept(subject, (*HOST_POOL, *DECODE))
    must_accept(subject, (BACKUP, "cpu_tensor"))


@contract(
    "HOST-POOL-NO-DCP", FN, rules=("K12",), options=OPTIONS, rule=f"{BACKUP}=host_pool with --dcp-size > 1 is a ValueError.",
)
def host_pool_no_dcp(subject) -> None:
    for size in ("2", "8"):
        must_reject(subject, (*HOST_POOL, *DECODE, "--dcp-size", size), (BACKUP, "host_pool", "--dcp-size"), types=VALUE_TYPES)
    must_accept(subject, (*HOST_POOL, *DECODE, "--dcp-size", "1"))
    must_accept(subject, (*DECODE, "--dcp-size", "2"))


@contract(
    "HOST-POOL-PRIORITY-PREEMPTION", FN, rules=("K13",), options=OPTIONS,
    rule=f"{BACKUP}=host_pool with --enable-priority-scheduling needs --disable-priority-preemption (ValueError otherwise).",
)
def host_pool_priority(subject) -> None:
    must_reject(
        subject, (*HOST_POOL, *DECODE, "--enable-priority-scheduling"), (BACKUP, "--disable-priority-preemption"),
        types=VALUE_TYPES,
    )
    must_accept(subject, (*HOST_POOL, *DECODE, "--enable-priority-scheduling", "--disable-priority-preemption"))
    must_accept(subject, (*HOST_POOL, *DECODE))
    must_accept(subject, (*DECODE, "--enable-priority-scheduling"))


@contract(
    "HICACHE-VS-NO-RADIX", FN, rules=("K14",), options=OPTIONS,
    note="The seed names the flags without leading dashes; ours uses --flag spelling. SGLang 0.5.23's "
    "handle_cache_compatibility adds rules the seed lacks (T-LRU radix eviction config, --swa-prefix-tails, and "
    "LMCache exclusivity with hierarchical cache / radix off / speculative / DP attention / DCP / PD).",
)
def hicache_vs_no_radix(subject) -> None:
    """--enable-hierarchical-cache and --disable-radix-cache are mutually exclusive (ValueError naming both)."""
    must_reject(
        subject, ("--enable-hierarchical-cache", "--disable-radix-cache"),
        ("enable-hierarchical-cache", "disable-radix-cache", "mutually exclusive"), types=VALUE_TYPES,
    )
    must_accept(subject, ("--enable-hierarchical-cache",))
    must_accept(subject, ("--disable-radix-cache",))


@contract(
    "DECODE-OFFLOAD-DECODE-SIDE", FN, rules=("K15",), options=OPTIONS,
    rule=f"{OFFLOAD} is a ValueError unless --disaggregation-mode decode.",
)
def decode_offload_decode_side(subject) -> None:
    for mode in ("null", "prefill"):
        must_reject(subject, (OFFLOAD, *STORAGE, "--disaggregation-mode", mode), (OFFLOAD.lstrip("-"), "decode"), types=VALUE_TYPES)
    must_accept(subject, (OFFLOAD, *STORAGE, *DECODE))


@contract(
    "DECODE-OFFLOAD-NEEDS-STORAGE", FN, rules=("K16",), options=OPTIONS,
    rule=f"{OFFLOAD} without --hicache-storage-backend is a ValueError.",
)
def decode_offload_needs_storage(subject) -> None:
    must_reject(subject, (OFFLOAD, *DECODE), (OFFLOAD.lstrip("-"), "hicache-storage-backend"), types=VALUE_TYPES)
    for backend in ("file", "mooncake"):
        must_accept(subject, (OFFLOAD, *DECODE, "--hicache-storage-backend", backend))


@contract(
    "DECODE-OFFLOAD-VS-HOST-POOL", FN, rules=("K17",), options=OPTIONS,
    rule=f"{OFFLOAD} and {BACKUP}=host_pool are mutually exclusive (both build a decode host pool).",
)
def decode_offload_vs_host_pool(subject) -> None:
    must_reject(
        subject, (OFFLOAD, *STORAGE, *DECODE, *HOST_POOL),
        (OFFLOAD.lstrip("-"), BACKUP.lstrip("-"), "host_pool", "mutually exclusive"), types=VALUE_TYPES,
    )
    must_accept(subject, (OFFLOAD, *STORAGE, *DECODE, BACKUP, "cpu_tensor"))


@contract(
    "SWA-RATIO-RANGE", FN, rules=("K18",), options=OPTIONS,
    note="SGLang 0.5.23 makes the field Optional (fallback 0.8) and reads the effective value with "
    "resolution_result; same range.",
)
def swa_ratio_range(subject) -> None:
    """The resolved --swa-full-tokens-ratio must lie in (0, 1.0]: 0, negatives and values above 1 are a ValueError."""
    for bad in ("0", "0.0", "-0.25", "1.5", "1.0001"):
        must_reject(subject, ("--swa-full-tokens-ratio", bad), ("--swa-full-tokens-ratio", "(0, 1.0]"), types=VALUE_TYPES)
    for good in ("1.0", "1", "0.5", "0.001"):
        must_accept(subject, ("--swa-full-tokens-ratio", good))
    must_accept(subject, ())
