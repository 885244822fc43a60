"""Loading within memory (issue 22): embedding tables kept in the checkpoint's dtype or memory-mapped,
tensors read straight into their parameters, and the safetensors reader's integrity checks."""

from __future__ import annotations

import os
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from impl.model import safetensors_io
from impl.model.loader import MMAP_ENV, load_model
from impl.checkpoint_factory.checkpoints import tiny_checkpoint
from tests.helpers.model import bf16_copy, prompt
from tests.helpers.session import Session


@pytest.fixture(scope="module")
def bf16_ckpt(tmp_path_factory) -> str:
    return bf16_copy(tmp_path_factory)


def _logits(model, toks):
    return Session(model).step([("a", toks)], all_logits=True).logits


@pytest.mark.slow  # loads a model twice
def test_float32_over_bf16_keeps_both_tables_bf16_and_maps_the_ple_table(bf16_ckpt, monkeypatch):
    from transformers import Gemma4ForCausalLM

    from impl.model import loader

    model = load_model(bf16_ckpt, dtype="float32")
    assert model.embed_tokens.weight.dtype == model.embed_tokens_per_layer.weight.dtype == torch.bfloat16
    others = {n: p.dtype for n, p in model.named_parameters() if "embed_tokens" not in n}
    assert set(others.values()) == {torch.float32}
    plan = model.weight_plan
    assert set(plan.mapped) == {"embed_tokens_per_layer.weight"}
    table = model.embed_tokens_per_layer.weight
    assert plan.mapped_bytes == table.numel() * 2
    assert plan.resident_bytes == sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                                      if n != "embed_tokens_per_layer.weight")
    toks = prompt(20, 3)
    got = _logits(model, toks)
    # exactly the logits of the same model with both tables widened to float32 (the former behaviour)
    monkeypatch.setattr(loader, "EMBEDDING_TABLES", ())
    widened = load_model(bf16_ckpt, dtype="float32")
    assert widened.embed_tokens.weight.dtype == torch.float32 and not widened.weight_plan.mapped
    assert torch.equal(got, _logits(widened, toks))
    # and within 10x transformers' own float32 error of its float64 logits on these weights
    with torch.no_grad():
        ref = {dt: Gemma4ForCausalLM.from_pretrained(bf16_ckpt, dtype=dt).eval()(torch.tensor([toks])).logits[0].double()
               for dt in (torch.float32, torch.float64)}
    hf_err = (ref[torch.float32] - ref[torch.float64]).abs().max().item()
    assert (got.double() - ref[torch.float64]).abs().max().item() <= 10 * hf_err


def test_mapping_off_loads_the_same_values_into_memory(bf16_ckpt, monkeypatch):
    toks = prompt(20, 3)
    mapped = _logits(load_model(bf16_ckpt, dtype="float32"), toks)
    monkeypatch.setenv(MMAP_ENV, "0")
    model = load_model(bf16_ckpt, dtype="float32")
    assert not model.weight_plan.mapped and model.embed_tokens_per_layer.weight.dtype == torch.bfloat16
    assert torch.equal(_logits(model, toks), mapped)


def test_bf16_load_reads_every_tensor_exactly(bf16_ckpt):
    model = load_model(bf16_ckpt, dtype="bfloat16")
    want = load_file(os.path.join(bf16_ckpt, "model.safetensors"))
    assert torch.equal(model.embed_tokens_per_layer.weight, want["model.embed_tokens_per_layer.weight"])
    assert torch.equal(model.layers[3].mlp.down_proj.weight, want["model.layers.3.mlp.down_proj.weight"])
    assert torch.equal(model.layers[0].layer_scalar, want["model.layers.0.layer_scalar"])


def test_converting_reads_go_through_small_blocks(monkeypatch, tmp_path):
    t = {"a": torch.randn(37, 11), "b": torch.randn(5).to(torch.bfloat16), "c": torch.arange(6, dtype=torch.int64)}
    path = str(tmp_path / "x.safetensors")
    save_file(t, path)
    monkeypatch.setattr(safetensors_io, "BLOCK_BYTES", 24)
    entries = {e.name: e for e in safetensors_io.read_header(path)}
    out = torch.empty(37, 11, dtype=torch.bfloat16)
    safetensors_io.read_into(entries["a"], out)
    assert torch.equal(out, t["a"].to(torch.bfloat16))
    wide = torch.empty(5, dtype=torch.float32)
    safetensors_io.read_into(entries["b"], wide)
    assert torch.equal(wide, t["b"].float())
    same = torch.empty(6, dtype=torch.int64)
    safetensors_io.read_into(entries["c"], same)
    assert torch.equal(same, t["c"])
    assert torch.equal(safetensors_io.map_tensor(entries["a"]), t["a"])


def _resident_pages(path: str) -> tuple[int, int]:
    """(pages of ``path`` in the page cache, pages in all), by mincore(2) over a read-only map."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    size = os.path.getsize(path)
    page = mmap.PAGESIZE
    n = (size + page - 1) // page
    with open(path, "rb") as f:
        addr = libc.mmap(None, ctypes.c_size_t(size), mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), ctypes.c_long(0))
    vec = (ctypes.c_ubyte * n)()
    assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0, ctypes.get_errno()
    libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
    return sum(v & 1 for v in vec), n


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise: Linux")
def test_a_mapped_table_is_read_into_the_page_cache_in_the_background(tmp_path):
    """The PLE table is memory-mapped; its pages are read ahead so that a cold row costs no disk read."""
    path = str(tmp_path / "x.safetensors")
    t = torch.randn(512, 1024)  # 2 MB
    save_file({"t": t}, path)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    (entry,) = safetensors_io.read_header(path)
    resident, total = _resident_pages(path)
    if resident > total // 2:
        pytest.skip("the kernel kept the file's pages cached after POSIX_FADV_DONTNEED")
    thread = safetensors_io.read_ahead(entry)
    assert thread is not None
    thread.join(30)  # the read is submitted; the pages arrive asynchronously
    deadline = time.monotonic() + 30
    while _resident_pages(path)[0] < entry.nbytes // 4096 and time.monotonic() < deadline:
        time.sleep(0.05)
    resident, total = _resident_pages(path)
    assert resident >= entry.nbytes // 4096, (resident, total)
    assert torch.equal(safetensors_io.map_tensor(entry), t)


def test_file_rows_gather_what_the_map_holds_without_mapping_it(tmp_path, bf16_ckpt):
    path = str(tmp_path / "t.safetensors")
    t = torch.randn(300, 24).to(torch.bfloat16)
    save_file({"pad": torch.zeros(3, dtype=torch.int8), "t": t}, path)  # "t" starts at an odd offset
    entry = next(e for e in safetensors_io.read_header(path) if e.name == "t")
    rows = safetensors_io.FileRows(entry)
    ids = torch.tensor([[5, 299, 0], [5, 17, 42]])
    assert torch.equal(rows(ids), t[ids]) and rows(ids).shape == (2, 3, 24)
    assert rows(torch.tensor([], dtype=torch.long)).shape == (0, 24)
    for bad in (300, -1):
        with pytest.raises(IndexError, match="outside"):
            rows(torch.tensor([1, bad]))
    # the model's mapped PLE table gathers through its FileRows (the logits equal the in-memory table's:
    # test_mapping_off_loads_the_same_values_into_memory)
    model = load_model(bf16_ckpt, dtype="float32")
    table = model.embed_tokens_per_layer
    ids = torch.tensor(prompt(20, 3))
    assert torch.equal(table.file_rows(ids), table.weight[ids])


def test_corrupt_safetensors_files_are_named(tmp_path):
    path = str(tmp_path / "x.safetensors")
    save_file({"w": torch.randn(64, 64)}, path)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) - 100])  # truncated
    with pytest.raises(ValueError, match=r"x\.safetensors: tensor 'w'.*truncated or corrupt"):
        safetensors_io.read_header(path)
    open(path, "wb").write(b"\xff" * 8 + data[8:])
    with pytest.raises(ValueError, match="header length"):
        safetensors_io.read_header(path)


@pytest.mark.slow  # runs transformers beside the model
def test_streamed_multimodal_checkpoint_loads_its_text_model_like_transformers():
    """e2b-mm: the streamed writer's multimodal layout (sharded index, towers skipped, text under
    model.language_model.*) gives transformers' Gemma4ForConditionalGeneration logits."""
    from transformers import Gemma4ForConditionalGeneration

    path = tiny_checkpoint("e2b-mm")
    model = load_model(path, dtype="float32")
    toks = prompt(20, 3)
    with torch.no_grad():
        ref = {dt: Gemma4ForConditionalGeneration.from_pretrained(path, dtype=dt).eval()(torch.tensor([toks])).logits[0].double()
               for dt in (torch.float32, torch.float64)}
    hf_err = (ref[torch.float32] - ref[torch.float64]).abs().max().item()
    assert (_logits(model, toks).double() - ref[torch.float64]).abs().max().item() <= max(10 * hf_err, 1e-4)
