"""Reading safetensors files without a second copy of the weights.

``safetensors.safe_open(...).get_tensor`` returns a fresh tensor (a copy out of its memory map), so
loading through it holds each tensor twice, and the whole shard stays mapped and resident while it is
read: for Gemma-4 E2B's 4.7 GB per-layer-embedding table that is 9.4 GB at once. This module reads the
file format itself (an 8-byte little-endian header length, a JSON header of ``dtype`` / ``shape`` /
``data_offsets``, then the raw little-endian bytes) and offers two ways to get a tensor:

* ``read_into(entry, dest)``: the bytes go straight from the file into ``dest``'s storage
  (``os.preadv``; no temporary) when the dtypes match and ``dest`` is on the CPU; otherwise through one
  reusable block of ``BLOCK_BYTES`` that is converted (and moved) into ``dest`` piece by piece.
* ``map_tensor(entry)``: a zero-copy tensor over a private (copy-on-write) memory map of the file's
  bytes. Its pages are page cache, read from disk on first touch and reclaimable by the kernel, not
  anonymous memory: a table read only by row gathers costs only the rows that were touched.
* ``read_ahead(entry)``: asks the kernel, from a background thread, to read a mapped entry's bytes into
  the page cache (``POSIX_FADV_WILLNEED``: one sequential read instead of a synchronous disk read per
  page on first touch; on a slow disk, 40-55 MB/s on the shared machines, cold PLE rows made a decode
  step of Gemma-4 E2B take 2 s instead of 0.3 s). The pages stay reclaimable page cache.

* ``FileRows(entry)``: row gathers from a 2-D entry by ``os.preadv`` into a fresh tensor, for the mapped
  table's hot path. Gathering through the memory map costs resident memory far beyond the rows: the
  page cache holds large folios (the read-ahead and any sequential read of the file make them), and a
  fault maps the whole folio, so on Linux 6.18 2,000 random rows of E2B's PLE table (17.5 KB each, 34 MB)
  mapped 2.3 GB into the process, and a served benchmark ended with 4 GB of the 4.7 GB table resident
  (``MADV_RANDOM`` / ``MADV_NOHUGEPAGE`` changed nothing). Copying the rows out of the page cache maps nothing.

``read_index(paths)`` checks each header (integrity: offsets inside the file, byte counts equal to
shape x element size, no overlaps) before anything is read.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import weakref
import threading
import warnings
from dataclasses import dataclass

import torch

DTYPES = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
BLOCK_BYTES = 64 * 1024 * 1024  # conversion block: the only temporary a dtype-converting load holds
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorEntry:
    name: str
    path: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset of the first element in the file
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_header(path: str) -> list[TensorEntry]:
    """The tensors of one safetensors file, in file order; ValueError naming the file if it is malformed."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (hlen,) = struct.unpack("<Q", raw)
        if hlen > min(MAX_HEADER_BYTES, size - 8):
            raise ValueError(f"{path}: header length {hlen} is larger than the file allows; the file is truncated or not safetensors")
        try:
            header = json.loads(f.read(hlen))
        except ValueError as e:
            raise ValueError(f"{path}: the safetensors header is not valid JSON ({e})") from e
    base = 8 + hlen
    entries = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(meta.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has dtype {meta.get('dtype')!r}, which this loader does not read")
        shape = tuple(int(s) for s in meta["shape"])
        begin, end = (int(x) for x in meta["data_offsets"])
        entry = TensorEntry(name, path, dtype, shape, base + begin, end - begin)
        elsize = torch.empty((), dtype=dtype).element_size()
        if end < begin or base + end > size or entry.nbytes != entry.numel * elsize:
            raise ValueError(
                f"{path}: tensor {name!r} (shape {shape}, {meta.get('dtype')}) has data_offsets [{begin}, {end}] that do not "
                f"hold {entry.numel * elsize} bytes inside the {size}-byte file; the file is truncated or corrupt"
            )
        entries.append(entry)
    entries.sort(key=lambda e: e.start)
    for a, b in zip(entries, entries[1:]):
        if a.start + a.nbytes > b.start:
            raise ValueError(f"{path}: tensors {a.name!r} and {b.name!r} overlap; the file is corrupt")
    return entries


def read_index(paths: list[str]) -> list[TensorEntry]:
    """Every tensor of the checkpoint's files; a name in two files is an error."""
    out: list[TensorEntry] = []
    seen: dict[str, str] = {}
    for path in paths:
        for e in read_header(path):
            if e.name in seen:
                raise ValueError(f"tensor {e.name!r} is stored twice: in {seen[e.name]} and {path}")
            seen[e.name] = path
            out.append(e)
    return out


def _bytes_view(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's storage."""
    return t.reshape(-1).view(torch.uint8).numpy().data


def read_into(entry: TensorEntry, dest: torch.Tensor) -> None:
    """Fill ``dest`` (same number of elements; contiguous) with the entry's values, converted to ``dest``'s
    dtype and device."""
    if dest.numel() != entry.numel or not dest.is_contiguous():
        raise ValueError(f"read_into: {entry.name!r} needs a contiguous destination of {entry.numel} elements")
    fd = os.open(entry.path, os.O_RDONLY)
    try:
        if dest.dtype == entry.dtype and dest.device.type == "cpu":
            if entry.nbytes:
                _pread_full(fd, _bytes_view(dest), entry.start, entry.name)
            return
        elsize = entry.nbytes // max(entry.numel, 1)
        per_block = max(1, BLOCK_BYTES // max(elsize, 1))
        flat = dest.view(-1)
        buf = torch.empty(min(per_block, entry.numel) * elsize, dtype=torch.uint8)
        for first in range(0, entry.numel, per_block):
            n = min(per_block, entry.numel - first)
            chunk = buf[: n * elsize]
            _pread_full(fd, chunk.numpy().data, entry.start + first * elsize, entry.name)
            flat[first : first + n].copy_(chunk.view(entry.dtype))
    finally:
        os.close(fd)


def _pread_full(fd: int, view: memoryview, offset: int, name: str) -> None:
    done, total = 0, len(view)
    while done < total:
        n = os.preadv(fd, [view[done : done + (1 << 30)]], offset + done)
        if n <= 0:
            raise ValueError(f"tensor {name!r}: the file ended after {done} of {total} bytes")
        done += n


def mappable(entry: TensorEntry) -> bool:
    elsize = entry.nbytes // max(entry.numel, 1)
    return entry.numel > 0 and entry.start % elsize == 0


def map_tensor(entry: TensorEntry, random_access: bool = True) -> torch.Tensor:
    """The entry as a zero-copy CPU tensor over a private memory map of its file (writes, which nothing
    should do, would copy the touched pages and never reach the file). ``random_access``: advise the
    kernel not to read ahead (row gathers touch a few pages each)."""
    if not mappable(entry):
        raise ValueError(f"map_tensor: {entry.name!r} is not aligned to its element size in {entry.path}")
    page = mmap.ALLOCATIONGRANULARITY
    first = entry.start - entry.start % page
    with open(entry.path, "rb") as f:
        mm = mmap.mmap(f.fileno(), entry.start + entry.nbytes - first, access=mmap.ACCESS_COPY, offset=first)
    if random_access and hasattr(mmap, "MADV_RANDOM"):
        mm.madvise(mmap.MADV_RANDOM)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # frombuffer's note about buffers it does not own
        t = torch.frombuffer(mm, dtype=entry.dtype, count=entry.numel, offset=entry.start - first)
    return t.view(entry.shape)


class FileRows:
    """Rows of a 2-D checkpoint entry, read with ``os.preadv`` (no memory map: see the module's note).
    ``rows(ids)`` equals ``mapped_tensor[ids]`` for ids of any shape; an id outside the table raises
    IndexError. The file stays open for the object's life."""

    def __init__(self, entry: TensorEntry):
        if len(entry.shape) != 2 or entry.numel == 0:
            raise ValueError(f"FileRows: {entry.name!r} is not a non-empty 2-D tensor (shape {entry.shape})")
        self.name, self.start, self.dtype = entry.name, entry.start, entry.dtype
        self.num_rows, self.cols = entry.shape
        self.row_bytes = entry.nbytes // self.num_rows
        self.fd = os.open(entry.path, os.O_RDONLY)
        self._close = weakref.finalize(self, os.close, self.fd)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).tolist()
        out = torch.empty(len(flat), self.cols, dtype=self.dtype)
        if flat:
            bad = next((t for t in flat if not 0 <= t < self.num_rows), None)
            if bad is not None:
                raise IndexError(f"row {bad} is outside {self.name!r} ({self.num_rows} rows)")
            view = out.view(torch.uint8).numpy().data.cast("B")  # [len * row_bytes]
            rb, start, fd = self.row_bytes, self.start, self.fd
            for i, t in enumerate(flat):
                if os.preadv(fd, [view[i * rb:(i + 1) * rb]], start + t * rb) != rb:
                    _pread_full(fd, view[i * rb:(i + 1) * rb], start + t * rb, self.name)
        return out.view(*ids.shape, self.cols)


    def block(self, lo: int, hi: int) -> torch.Tensor:
        """Rows ``lo:hi`` (contiguous in the file) in one read: ``mapped_tensor[lo:hi]``."""
        if not 0 <= lo <= hi <= self.num_rows:
            raise IndexError(f"rows {lo}:{hi} are outside {self.name!r} ({self.num_rows} rows)")
        out = torch.empty(hi - lo, self.cols, dtype=self.dtype)
        if hi > lo:
            view = _bytes_view(out).cast("B")
            _pread_full(self.fd, view, self.start + lo * self.row_bytes, self.name)
        return out


def read_ahead(entry: TensorEntry) -> threading.Thread | None:
    """Start reading ``entry``'s bytes into the page cache in the background (a daemon thread; the call
    returns at once and the mapped tensor stays usable meanwhile); None where the platform has no
    ``posix_fadvise``. A hint: a failure changes no result, only when the pages arrive."""
    if not hasattr(os, "posix_fadvise"):
        return None

    def run() -> None:
        try:
            fd = os.open(entry.path, os.O_RDONLY)
        except OSError:
            return
        try:
            os.posix_fadvise(fd, entry.start, entry.nbytes, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)

    t = threading.Thread(target=run, name=f"read-ahead {os.path.basename(entry.path)}", daemon=True)
    t.start()
    return t

