"""deltapack: an authenticated delta store for paged prefix state (KV caches).

Publish the paged KV cache of a conversation turn after turn (each turn a
page delta on the one before), and restore it bit-exactly -- verified
before a single byte is handed over -- into memory you already own::

    import numpy as np, deltapack

    ident = deltapack.CacheIdentity.from_json(open("id.json").read())
    store = deltapack.Store("file:///var/cache/dp", budget="50GiB")
    store.publish(ident, tokens, snapshot, base=(base_tokens, base_snapshot))

    n = store.snapshot_size(ident, tokens)          # None: nothing stored
    pool = np.empty(n, dtype=np.uint8)               # or a preallocated pool
    r = store.restore_into(ident, tokens, pool)      # Hit | Miss, never raises on a miss
    if r:
        for (group, layer), pages in deltapack.snapshot_views(pool).items():
            ...                                      # pages: uint8 [n_pages, page_bytes]

What you get:

* **Zero copy.** ``restore_into`` writes the verified snapshot straight into
  your buffer (numpy array, bytearray, mmap, memoryview, anything with a
  writable C-contiguous buffer or ``__array_interface__``); nothing is
  allocated for the result. For a new buffer, :func:`fresh_buffer` makes
  one that is cheap to fault in. ``restore`` returns a read-only
  :class:`Restored` in deltapack's memory (numpy-viewable without a copy).
  ``publish`` reads the snapshot in place too, whatever holds it (a
  :class:`Snapshot`, a :class:`Restored`, or any C-contiguous buffer; see
  :meth:`Store.publish`).
* **The GIL is released** during every store call, so threads restore in
  parallel, and every I/O method has an ``*_async`` twin for asyncio.
* **A miss is a value.** :class:`Miss` has a ``reason`` among ``absent``,
  ``corrupt``, ``incompatible``, ``base-missing``, ``deadline-exceeded``,
  ``unauthenticated``. Failures are exceptions: :class:`Error` and its
  subclasses :class:`CapacityError`, :class:`ConflictError`,
  :class:`BadInput`, :class:`IoError`, :class:`LedgerMismatchError` (this
  handle's ledger is not the one the store names: it may read, not publish
  or delete).

**Layer by layer.** :meth:`Store.restore_layers_into` restores into your
buffer the same way but hands out each (group, layer) as a :class:`Layer`
as soon as its bytes are proven (``for layer in it`` or ``async for``), so a
placement layer can upload layer *k* while later layers are still read; its
last item is the :class:`Hit` or :class:`Miss` ``restore_into`` returns.

**What ``out`` holds after ``restore_into``.** On a :class:`Hit`, exactly the
verified snapshot encoding. After a :class:`Miss` (or an exception) it holds
no unverified byte: if the restore had already placed bytes, the whole
buffer was zeroed; if the miss was found first (no root, an unusable root,
the deadline already past) or the buffer was refused (:class:`BadInput`:
wrong size, read-only), it is exactly as you gave it. Do not read or write
``out`` from another thread while the call runs.
"""

from __future__ import annotations

import ctypes
import operator
import re
import sys
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from . import _native
from ._native import (
    BadInput,
    CacheIdentity,
    CapacityError,
    ConflictError,
    Error,
    IoError,
    Layer,
    LayerIterator,
    LedgerMismatchError,
    Turn,
)

if TYPE_CHECKING:  # pragma: no cover
    import numpy

__version__: str = _native.__version__

__all__ = [
    "BadInput",
    "Buffer",
    "CacheIdentity",
    "CapacityError",
    "ConflictError",
    "Error",
    "Hit",
    "IoError",
    "Layer",
    "LayerInfo",
    "LayerIterator",
    "LedgerMismatchError",
    "Lookup",
    "Miss",
    "MISS_REASONS",
    "Restored",
    "Snapshot",
    "SnapshotLayout",
    "Store",
    "Turn",
    "fresh_buffer",
    "new_snapshot",
    "parse_duration",
    "parse_size",
    "snapshot_layout",
    "snapshot_views",
    "synth",
]

#: Every value :attr:`Miss.reason` can take.
MISS_REASONS = (
    "absent",
    "corrupt",
    "incompatible",
    "base-missing",
    "deadline-exceeded",
    "unauthenticated",
)

#: Token ids: a sequence of ints, an integer array (uint32/int32/int64),
#: bytes of u32 little-endian ids (a token file), or a context digest given
#: directly as 64 lowercase hex characters.
Tokens = Union[str, bytes, Sequence[int], Any]

# --------------------------------------------------------------------- sizes


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*$")
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


def parse_size(size: Union[int, str]) -> int:
    """A byte count from an int or text such as ``"50GiB"``, ``"40 GB"``, ``"512MiB"``.

    Decimal units (kB, MB, GB, TB) are powers of 1000, binary units (KiB,
    MiB, GiB, TiB) powers of 1024. Raises :class:`BadInput` otherwise.
    """
    if isinstance(size, bool):
        raise BadInput(f"size {size!r} is not a byte count")
    if isinstance(size, int):
        if size < 0:
            raise BadInput(f"size {size} is negative")
        return size
    if isinstance(size, str):
        m = _SIZE.match(size)
        if m and m.group(2).lower() in _UNITS:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise BadInput(f"size {size!r}: use bytes (int) or text like '50GiB', '40GB', '512MiB'")


_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*(ms|s|m|h|d)?\s*$")
_SECONDS = {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(d: Union[int, float, str]) -> float:
    """Seconds from a number or text such as ``"1h"``, ``"15m"``, ``"30s"``, ``"7d"``."""
    if isinstance(d, bool):
        raise BadInput(f"duration {d!r} is not a number of seconds")
    if isinstance(d, (int, float)):
        if d < 0:
            raise BadInput(f"duration {d} is negative")
        return float(d)
    if isinstance(d, str):
        m = _DURATION.match(d)
        if m:
            return float(m.group(1)) * _SECONDS[m.group(2)]
    raise BadInput(f"duration {d!r}: use seconds or text like '1h', '15m', '30s'")


# ----------------------------------------------------------------- snapshots


class _Bytes:
    """Bytes held in deltapack's (Rust) memory, ``self._data``, exported
    without a copy: read-only for a :class:`Snapshot`, writable for a
    :class:`Buffer` (``_writable``).

    ``_data`` (the native object that owns the allocation) is set once and
    can be neither reassigned nor deleted: views and borrows keep it alive,
    and a wrapper that dropped it while a view or a restore still used the
    memory would free memory in use."""

    __slots__ = ("_data", "__weakref__")
    _writable: bool = False

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_data" and hasattr(self, "_data"):
            raise AttributeError(f"{type(self).__name__}._data cannot be reassigned")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if name == "_data":
            raise AttributeError(f"{type(self).__name__}._data cannot be deleted")
        object.__delattr__(self, name)

    @property
    def nbytes(self) -> int:
        """Length in bytes."""
        return len(self._data)

    def __len__(self) -> int:
        return len(self._data)

    @property
    def address(self) -> int:
        """Address of the first byte (valid while this object or a view of it lives)."""
        return self._data.address

    @property
    def __array_interface__(self) -> Dict[str, Any]:
        """numpy's array interface: ``numpy.asarray(x)`` is a zero-copy view
        (read-only for a :class:`Snapshot`, writable for a :class:`Buffer`)."""
        return self._data.__array_interface__

    def memoryview(self) -> memoryview:
        """A ``memoryview`` of the bytes (zero copy; keeps the memory alive;
        read-only for a :class:`Snapshot`, writable for a :class:`Buffer`).

        A :class:`Snapshot`'s view never leads to writable memory: with
        numpy installed it is a view of a read-only array whose base (this
        snapshot) exports no writable form, so neither the view nor
        its ``.obj`` can write. Without numpy it is a read-only view of a
        ``ctypes`` array, whose ``.obj.obj`` would be writable: install
        numpy (or use Python 3.12+'s ``memoryview(snapshot)``, whose
        ``.obj`` is the snapshot itself) where that matters."""
        n = len(self._data)
        if n == 0:
            return memoryview(bytearray() if self._writable else b"")
        if not self._writable:
            try:
                import numpy as np
            except ImportError:  # pragma: no cover - numpy is a test dependency
                np = None
            if np is not None:
                return memoryview(np.asarray(self))
        arr = (ctypes.c_ubyte * n).from_address(self._data.address)
        # A ctypes array made from an address does not own its memory: the
        # references keep this object and the native owner itself (even if
        # `_data` were forced out of this wrapper) alive as long as the
        # array (and so the memoryview, and any array made from it) lives.
        arr._deltapack_owner = (self, self._data)  # type: ignore[attr-defined]
        view = memoryview(arr).cast("B")
        return view if self._writable else view.toreadonly()

    def __buffer__(self, flags: int) -> memoryview:
        """The buffer protocol (Python 3.12+, PEP 688): :meth:`memoryview`."""
        return self.memoryview()

    def numpy(self) -> "numpy.ndarray":
        """A ``uint8`` numpy array over the bytes (zero copy; read-only for a
        :class:`Snapshot`, writable for a :class:`Buffer`; keeps this
        object, whose ``_data`` cannot be reassigned, alive)."""
        import numpy as np

        return np.asarray(self)


class Snapshot(_Bytes):
    """A snapshot encoding held in deltapack's memory: read-only, zero-copy.

    Returned by :meth:`Store.restore` (as its subclass :class:`Restored`)
    and by :func:`synth`. Passing it to :meth:`Store.publish` (as the
    snapshot or the base) costs no copy.

    Views, all without copying and all keeping this object alive:

    * ``numpy.asarray(s)`` -- a read-only ``uint8`` array (through
      ``__array_interface__``);
    * ``s.memoryview()`` -- a read-only ``memoryview``;
    * ``memoryview(s)``, ``numpy.frombuffer(s, numpy.uint8)`` -- the buffer
      protocol itself, on Python 3.12 and later (PEP 688);
    * :func:`snapshot_views` -- per (group, layer) page arrays.

    ``bytes(s)`` / ``s.tobytes()`` make a copy.
    """

    __slots__ = ("_digest",)

    def __init__(self, data: "_native.SnapshotData", digest: Optional[str] = None) -> None:
        self._data = data
        self._digest = digest

    @property
    def boundary(self) -> int:
        """Tokens covered by the snapshot."""
        return self._data.boundary

    @property
    def digest(self) -> str:
        """The snapshot digest: for a :class:`Restored`, the one its root
        records; otherwise the one a publication records today, the
        layered digest ``blake3-layers:<64 hex>`` (``blake3:<64 hex>``,
        BLAKE3 of the encoding, for layouts of more than 65,536 layers,
        and in roots written before v2.2)."""
        if self._digest is None:
            try:
                self._digest = self._data.layers_digest()
            except ValueError:
                self._digest = self._data.digest()
        return self._digest

    def tobytes(self) -> bytes:
        """A copy of the encoding as ``bytes``."""
        return self._data.tobytes()

    def __bytes__(self) -> bytes:
        return self._data.tobytes()

    def layout(self) -> "SnapshotLayout":
        """The page layout (see :func:`snapshot_layout`)."""
        return _layout(self._data.layout())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(boundary={self.boundary}, nbytes={self.nbytes})"


class Restored(Snapshot):
    """A verified snapshot returned by :meth:`Store.restore` (truthy).

    Lives in deltapack's memory and may be shared with the store's
    verified-base cache (while you hold it, the next turn's restore starts
    from it), so it is read-only. See :class:`Snapshot` for the views.
    """

    __slots__ = ("schema",)

    def __init__(self, data: "_native.SnapshotData", digest: str, schema: str) -> None:
        super().__init__(data, digest)
        #: Schema of the root it came from (``deltapack-page-delta-manifest/v2``, …).
        self.schema: str = schema

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return (
            f"Restored(boundary={self.boundary}, nbytes={self.nbytes}, "
            f"digest={self.digest!r}, schema={self.schema!r})"
        )


class Hit:
    """``restore_into`` succeeded: ``out`` holds the verified snapshot (truthy)."""

    __slots__ = ("nbytes", "digest", "address")

    def __init__(self, nbytes: int, digest: str, address: int) -> None:
        #: Bytes written (the whole buffer).
        self.nbytes: int = nbytes
        #: The snapshot digest, ``blake3:<64 hex>``.
        self.digest: str = digest
        #: Address of the buffer written: always the caller's own ``out``.
        self.address: int = address

    def __bool__(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Hit) and (other.nbytes, other.digest) == (self.nbytes, self.digest)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Hit(nbytes={self.nbytes}, digest={self.digest!r})"


class Miss:
    """No usable state: recompute the prefix (falsy). Not an error.

    ``reason`` is one of :data:`MISS_REASONS`: ``absent`` (nothing stored),
    ``corrupt`` (a root or object failed verification; it was quarantined
    once proven), ``incompatible`` (a format this version cannot read),
    ``base-missing`` (a delta's base is gone), ``deadline-exceeded`` (the
    ``timeout`` passed), ``unauthenticated`` (a keyed store's MAC is wrong or
    missing). ``detail`` is the store's explanation. ``object`` is the store
    key of the object that failed verification or is missing, when the store
    names one (``corrupt`` and ``base-missing`` misses), else ``None``.
    """

    __slots__ = ("reason", "detail", "object")

    def __init__(self, reason: str, detail: str, object: Optional[str] = None) -> None:
        #: One of :data:`MISS_REASONS`.
        self.reason: str = reason
        #: Human-readable explanation (reason and detail).
        self.detail: str = detail
        #: Store key of the damaged or missing object, if one is named.
        self.object: Optional[str] = object

    def __bool__(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Miss) and other.reason == self.reason

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Miss(reason={self.reason!r}, detail={self.detail!r}, object={self.object!r})"


class Lookup(NamedTuple):
    """The longest stored prefix of a request: its boundary, context, and
    where the answer came from."""

    #: Tokens covered by the stored snapshot.
    boundary: int
    #: Its context digest (64 hex); pass it as ``tokens`` to restore it.
    context: str
    #: ``ledger`` (the capacity ledger's index) or ``store`` (the roots
    #: probed by name: the ledger was down, slower than its deadline, or
    #: knew none of the request's boundaries). The same boundary either way.
    source: str


class LayerInfo(NamedTuple):
    """Where one (group, layer) of a snapshot lives in its encoding."""

    group: int
    layer: int
    name: str
    dtype: str
    #: ``full`` (one page per ``tokens_per_page`` tokens) or ``recurrent`` (one checkpoint page).
    kind: str
    #: Tokens per page of the group (for ``recurrent``, the checkpoint cadence).
    tokens_per_page: int
    #: Byte offset of the layer's first page in the encoding.
    offset: int
    #: Pages of the layer (its group's block count).
    pages: int
    #: Bytes of one page of this layer.
    page_bytes: int


class SnapshotLayout(NamedTuple):
    """The parsed header of a snapshot encoding."""

    #: Bytes before the payload (magic, length, CBOR header).
    payload_offset: int
    #: Tokens covered.
    boundary: int
    #: Every (group, layer) in payload order.
    layers: List[LayerInfo]

    def to_dict(self) -> Dict[str, Any]:
        """The page layout as :func:`new_snapshot` takes it."""
        groups: Dict[int, Dict[str, Any]] = {}
        for li in self.layers:
            g = groups.setdefault(
                li.group, {"kind": li.kind, "tokens_per_page": li.tokens_per_page, "layers": []}
            )
            g["layers"].append({"name": li.name, "dtype": li.dtype, "bytes_per_page": li.page_bytes})
        return {"groups": [groups[k] for k in sorted(groups)]}


def _layout(raw: Tuple[int, int, list]) -> SnapshotLayout:
    return SnapshotLayout(raw[0], raw[1], [LayerInfo(*a, *b, *c) for a, b, c in raw[2]])


def snapshot_layout(buf: Any) -> SnapshotLayout:
    """Parses the header of a snapshot encoding held in any buffer (no copy).

    The buffer's length must be exactly the encoding's; raises
    :class:`BadInput` otherwise.
    """
    if isinstance(buf, Snapshot):
        return buf.layout()
    return _layout(_native.snapshot_layout(buf))


def _uint8(buf: Any) -> "numpy.ndarray":
    """A flat uint8 numpy view of ``buf`` (writable if ``buf`` is)."""
    import numpy as np

    if isinstance(buf, (Snapshot, Buffer)):
        return np.asarray(buf)
    if isinstance(buf, np.ndarray):
        if not buf.flags["C_CONTIGUOUS"]:
            raise BadInput("the array must be C-contiguous")
        return buf.reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(buf, dtype=np.uint8)
    except (TypeError, ValueError):
        return np.asarray(buf).reshape(-1).view(np.uint8)


def snapshot_views(buf: Any) -> Dict[Tuple[int, int], "numpy.ndarray"]:
    """Zero-copy numpy views of a snapshot's pages: ``{(group, layer): pages}``.

    Each value is a ``uint8`` array of shape ``[pages, page_bytes]`` viewing
    the (group, layer)'s pages inside ``buf`` (a numpy array, bytearray,
    mmap, :class:`Snapshot`, …): writable if ``buf`` is, read-only for a
    :class:`Snapshot`. Reinterpret a page with ``.view(numpy.float16)`` etc.
    (``LayerInfo.dtype`` from :func:`snapshot_layout` names the element type).
    Requires numpy.
    """
    layout = snapshot_layout(buf)
    flat = _uint8(buf)
    views = {}
    for li in layout.layers:
        end = li.offset + li.pages * li.page_bytes
        views[(li.group, li.layer)] = flat[li.offset : end].reshape(li.pages, li.page_bytes)
    return views


def _layout_json(layout: Union[str, Dict[str, Any]]) -> str:
    import json

    return layout if isinstance(layout, str) else json.dumps(layout)


def new_snapshot(
    layout: Union[str, Dict[str, Any]], boundary: int, out: Optional[Any] = None
) -> Any:
    """Prepares a snapshot encoding to fill: header written, pages zero.

    ``layout`` is the page layout as a dict or JSON text, e.g.
    ``{"groups": [{"kind": "full", "tokens_per_page": 256, "layers":
    [{"name": "layer.0.kv", "dtype": "bf16", "bytes_per_page": 65536}, …]}]}``.
    Without ``out`` a ``bytearray`` of the exact size is returned; with
    ``out`` (a writable buffer of exactly that size, e.g. a preallocated
    numpy array) the header is written into it and ``out`` is returned.
    Fill the pages through :func:`snapshot_views`, then :meth:`Store.publish`.
    """
    prefix, total = _native.snapshot_prefix(_layout_json(layout), int(boundary))
    if out is None:
        out = bytearray(total)
    mv = memoryview(out).cast("B") if not hasattr(out, "__array_interface__") else None
    if mv is not None:
        if mv.nbytes != total:
            raise BadInput(f"out is {mv.nbytes} bytes, the snapshot needs {total}")
        mv[: len(prefix)] = prefix
    else:
        flat = _uint8(out)
        if flat.nbytes != total:
            raise BadInput(f"out is {flat.nbytes} bytes, the snapshot needs {total}")
        import numpy as np

        flat[: len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    return out


def synth(tokens: int, preset: str = "tiny", seed: int = 1) -> Tuple[Snapshot, List[int]]:
    """A deterministic synthetic conversation (the data of ``deltapack synth``).

    Returns its snapshot at ``tokens`` tokens and the token ids. The same
    seed with more tokens extends the same conversation (full pages stay
    byte-identical), so two calls make a base and a result for a delta.
    Presets: ``tiny`` (KiB pages) and ``default`` (the benchmark geometry,
    ≈ 6.1 MiB per 1,000 tokens).
    """
    data, ids = _native.synth(int(tokens), preset, int(seed))
    return Snapshot(data), ids


# ------------------------------------------------------------- fresh buffers


class Buffer(_Bytes):
    """A zero-filled, writable buffer in deltapack's memory, made by :func:`fresh_buffer`.

    Meant as the ``out`` of :meth:`Store.restore_into`,
    :meth:`Store.restore_into_async` and :meth:`Store.restore_layers_into`
    (borrowed in place through its ``__array_interface__``, like any other
    ``out``), and usable wherever a writable ``uint8`` buffer is (e.g.
    :func:`snapshot_views`, :meth:`Store.publish`). The memory is freed
    once this object and every view of it are gone.

    Views, all without copying, all writable and all keeping this object
    alive:

    * ``b.numpy()`` / ``numpy.asarray(b)`` -- a ``uint8`` array (through
      ``__array_interface__``);
    * ``b.memoryview()`` -- a ``memoryview``;
    * ``memoryview(b)``, ``numpy.frombuffer(b, numpy.uint8)`` -- the buffer
      protocol itself, on Python 3.12 and later (PEP 688);
    * :func:`snapshot_views` -- per (group, layer) page arrays, once it
      holds a snapshot.
    """

    __slots__ = ()
    _writable = True

    def __init__(self, data: "_native.FreshBuffer") -> None:
        self._data = data

    def __repr__(self) -> str:
        return f"Buffer(nbytes={self.nbytes})"


def fresh_buffer(nbytes: int) -> Buffer:
    """A new zero-filled, writable :class:`Buffer` of exactly ``nbytes`` bytes, to restore into.

    Allocated as :meth:`Store.restore` allocates its own result: no page is
    touched here (memory is committed where it is first written) and, on
    Linux, a large buffer is advised for transparent huge pages, so the
    restore that first writes it faults it in 2 MiB at a time instead of
    4 KiB -- except on a VM whose memory balloon reports free pages to the
    host, where a huge-page fault costs more than 512 small ones
    (``DELTAPACK_FRESH_BUFFERS=huge`` or ``small`` overrides). Use it
    for a new ``out`` instead of plain memory such as ``mmap.mmap(-1, n)``
    or ``torch.empty(n)``, or ``bytearray(n)`` (zeroed, so every page
    touched, when made). Large numpy arrays get the same advice from numpy
    itself on Linux (unless ``NUMPY_MADVISE_HUGEPAGE=0``)::

        n = store.snapshot_size(ident, tokens)      # None: nothing stored
        buf = deltapack.fresh_buffer(n)
        if store.restore_into(ident, tokens, buf):
            pages = deltapack.snapshot_views(buf)   # writable numpy views

    ``nbytes`` must be a non-negative int (:class:`BadInput` otherwise);
    a size that cannot be allocated raises ``MemoryError``.
    """
    if isinstance(nbytes, bool):
        raise BadInput(f"nbytes {nbytes!r} is not a byte count")
    try:
        n = operator.index(nbytes)
    except TypeError:
        raise BadInput(f"nbytes {nbytes!r} is not a byte count (an int)") from None
    if n < 0:
        raise BadInput(f"nbytes {n} is negative")
    if n > sys.maxsize:
        raise MemoryError(f"fresh_buffer({n}): larger than the address space")
    return Buffer(_native.fresh_buffer(n))


# --------------------------------------------------------------------- store


def _restore_value(v: tuple) -> Union[Restored, Miss]:
    if v[0] == "hit":
        return Restored(v[1], v[2], v[3])
    return Miss(v[1], v[2], v[3])


def _restore_into_value(v: tuple) -> Union[Hit, Miss]:
    if v[0] == "hit":
        return Hit(v[1], v[2], v[3])
    return Miss(v[1], v[2], v[3])


def _lookup_value(v: Optional[Tuple[int, str, str]]) -> Optional[Lookup]:
    return None if v is None else Lookup(*v)


def _base_args(base: Optional[Tuple[Tokens, Any]]) -> Tuple[Any, Any]:
    if base is None:
        return None, None
    try:
        base_tokens, base_snapshot = base
    except (TypeError, ValueError):
        raise BadInput("base must be a (base_tokens, base_snapshot) pair") from None
    return base_tokens, base_snapshot


class Store:
    """A deltapack store: publish snapshots, restore them verified.

    ``url``: ``file:///path`` (or a plain path), ``s3://bucket/prefix``
    (settings from the ``AWS_*`` environment variables; append
    ``?endpoint=http://127.0.0.1:9000`` for a local server), or
    ``memory://``.

    Options (all optional):

    * ``ledger`` -- what to do with the capacity ledger at open: ``"load"``
      (default: trust it after a consistency check, rebuild if it disagrees
      with the store) or ``"rebuild"``.
    * ``ledger_url`` -- where the capacity ledger lives:
      ``"sqlite:///path/ledger.sqlite3"`` or ``"postgres://user@host/db"``
      (the fleet ledger every node of a bucket shares); default: the
      ``DELTAPACK_LEDGER`` environment variable, as for the CLI, else the
      store's own (inside a ``file://`` store; a file under the state
      directory for ``s3://``).
    * ``budget`` -- hard size limit (bytes, or text like ``"50GiB"``);
      publications evict least recently used roots to stay within it.
    * ``root_key`` -- secret (bytes or str) authenticating roots in a keyed
      store; the CLI reads the same secret from ``DELTAPACK_ROOT_KEY``.
    * ``min_free`` -- free space to keep on a local store's file system.
    * ``grace`` -- how long unreferenced objects survive (seconds or text
      like ``"1h"``, the default; zero only for a single-process store).
    * ``max_extent_bytes``, ``compression`` (zstd level), ``max_chain_depth``
      (0: unbounded), ``max_read_overhead`` (negative: unbounded),
      ``prefill_rate`` (tokens/s, to count hits cheaper than prefill).
    * ``tier`` -- a node-local tier in front of the store (a local
      directory, ``"file:///nvme/deltapack"``): restores read it first with
      the same verification and fall through to the store on a miss or
      damage; restores from the store fill it in the background;
      publications go to both. ``tier_budget`` bounds it (bytes or text);
      ``tier_ack="tier"`` acknowledges publications once durable in the
      tier and uploads them behind (:meth:`tier_upload` uploads now).

    A handle is safe to share between threads. Every method that touches
    storage releases the GIL while it runs, and has an ``*_async`` twin
    (``await store.restore_into_async(...)``) for asyncio. The work runs on
    one shared tokio runtime per process; a process forked after it started
    has no runtime threads, so open stores in the worker processes (or use
    the ``spawn`` start method), not in a parent that forks afterwards.

    ``tokens`` arguments name a context: token ids (a list of ints, a
    uint32/int64 numpy array, bytes of u32 little-endian ids) or the
    context digest itself as 64 hex characters (e.g. ``Lookup.context``).
    """

    __slots__ = ("_native", "__weakref__")

    def __init__(
        self,
        url: str,
        ledger: Optional[str] = None,
        budget: Union[int, str, None] = None,
        root_key: Union[bytes, str, None] = None,
        *,
        ledger_url: Optional[str] = None,
        min_free: Union[int, str, None] = None,
        grace: Union[float, str, None] = None,
        max_extent_bytes: Optional[int] = None,
        compression: Optional[int] = None,
        max_chain_depth: Optional[int] = None,
        max_read_overhead: Optional[float] = None,
        prefill_rate: Optional[float] = None,
        tier: Optional[str] = None,
        tier_budget: Union[int, str, None] = None,
        tier_ack: Optional[str] = None,
    ) -> None:
        if isinstance(root_key, str):
            root_key = root_key.encode()
        self._native = _native.Store(
            str(url),
            ledger=ledger,
            ledger_url=ledger_url,
            budget=None if budget is None else parse_size(budget),
            min_free=None if min_free is None else parse_size(min_free),
            grace=None if grace is None else parse_duration(grace),
            root_key=root_key,
            max_extent_bytes=max_extent_bytes,
            compression=compression,
            max_chain_depth=max_chain_depth,
            max_read_overhead=max_read_overhead,
            prefill_rate=prefill_rate,
            tier=None if tier is None else str(tier),
            tier_budget=None if tier_budget is None else parse_size(tier_budget),
            tier_ack=tier_ack,
        )

    @property
    def url(self) -> str:
        """The URL the store was opened with."""
        return self._native.url

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        # Leaving the block never fails because the ledger is away: the
        # counters and accesses it could not take are this handle's loss.
        try:
            self.flush()
        except IoError as e:
            import warnings

            warnings.warn(f"deltapack: counters not persisted: {e}", RuntimeWarning, stacklevel=2)

    # -- publication ---------------------------------------------------

    def publish(
        self,
        identity: CacheIdentity,
        tokens: Tokens,
        snapshot: Any,
        base: Optional[Tuple[Tokens, Any]] = None,
    ) -> Dict[str, Any]:
        """Publishes a snapshot under ``tokens``' context; returns the receipt.

        ``snapshot`` is an encoded snapshot: a :class:`Snapshot` /
        :class:`Restored`, or any C-contiguous buffer -- bytes, bytearray,
        memoryview, mmap, a numpy array. It is read in place, never copied
        (the GIL is released while it is hashed and written), so do not
        change the buffer until the call returns (for ``publish_async``:
        until the awaitable completes); the store keeps no reference to it
        afterwards. ``len(tokens)`` must equal the snapshot's boundary (a
        multiple of ``identity.chunk_tokens``).

        ``base=(base_tokens, base_snapshot)`` publishes a page delta on an
        already published base (typically the previous turn; pass the
        :class:`Restored` you got for it to avoid a copy). The chain policy
        may still publish it flat (``receipt["rebased"]``).

        The receipt is a dict: ``outcome`` (``created`` or
        ``already-present``), ``schema``, ``snapshot_digest``,
        ``payload_len``, ``objects_written``, ``bytes_written``,
        ``chain_depth``, ``rebased``, timings in ms, …

        Raises :class:`ConflictError` if the context holds a different
        snapshot, :class:`CapacityError` if it does not fit,
        :class:`BadInput` for an invalid identity, snapshot or base,
        :class:`IoError` if storage fails.
        """
        bt, bs = _base_args(base)
        return self._native.publish(identity, tokens, snapshot, bt, bs)

    async def publish_async(
        self,
        identity: CacheIdentity,
        tokens: Tokens,
        snapshot: Any,
        base: Optional[Tuple[Tokens, Any]] = None,
    ) -> Dict[str, Any]:
        """:meth:`publish` for asyncio (the event loop keeps running)."""
        bt, bs = _base_args(base)
        return await self._native.publish_async(identity, tokens, snapshot, bt, bs)

    def publish_turn(
        self,
        identity: CacheIdentity,
        tokens: Tokens,
        prev: Turn,
        tail: Any,
    ) -> Dict[str, Any]:
        """Publishes the turn after ``prev`` from its new pages alone.

        ``prev`` is the :class:`Turn` of the previous turn: ``receipt["turn"]``
        of its :meth:`publish` or :meth:`publish_turn`, or
        :meth:`turn_from`. ``tokens`` are the token ids up to the new
        boundary. ``tail`` holds, for every group and layer (payload order),
        the pages from ``prev.kept_pages`` to the new page count:
        ``prev.tail_len(len(tokens))`` bytes, from any C-contiguous buffer
        (numpy, bytes, memoryview, mmap), read in place and never copied.
        Only the tail is hashed; the conversation is not read again.

        Returns the receipt, whose ``turn`` is the handle for the next call.
        Raises :class:`BadInput` (nothing written) for a tail of the wrong
        length, a boundary not above ``prev``'s or off the chunk grid, or a
        handle from another store or identity.
        """
        return self._native.publish_turn(identity, tokens, prev, tail)

    async def publish_turn_async(
        self,
        identity: CacheIdentity,
        tokens: Tokens,
        prev: Turn,
        tail: Any,
    ) -> Dict[str, Any]:
        """:meth:`publish_turn` for asyncio."""
        return await self._native.publish_turn_async(identity, tokens, prev, tail)

    def turn_from(self, identity: CacheIdentity, tokens: Tokens, snapshot: Any) -> Turn:
        """A :class:`Turn` for a snapshot already published under ``tokens``
        (e.g. the :class:`Restored` of a restore), to continue the
        conversation with :meth:`publish_turn`. Free for a snapshot this
        handle published (the same object); any other snapshot (restored,
        read from a file) costs about one page per layer, proven against
        the turn state the root records; under a root written before turn
        states were recorded, the snapshot is hashed once."""
        return self._native.turn_from(identity, tokens, snapshot)

    # -- lookup and sizes ----------------------------------------------

    def lookup(self, identity: CacheIdentity, tokens: Tokens) -> Optional[Lookup]:
        """The longest stored prefix of a request, or ``None``.

        Checks every ``chunk_tokens`` boundary of ``tokens`` (token ids
        only) for a root -- existence checks, no payload read. The ledger's
        index answers first; when the ledger is down, failing or slower than
        ``ledger_deadline`` (50 ms by default), the roots are probed by name
        instead (``Lookup.source`` says which), with the GIL released.
        """
        return _lookup_value(self._native.lookup(identity, tokens))

    async def lookup_async(self, identity: CacheIdentity, tokens: Tokens) -> Optional[Lookup]:
        """:meth:`lookup` for asyncio."""
        return _lookup_value(await self._native.lookup_async(identity, tokens))

    def snapshot_size(self, identity: CacheIdentity, tokens: Tokens) -> Optional[int]:
        """Exact bytes :meth:`restore_into` needs, read from the root alone.

        ``None`` if there is no usable root (absent, damaged, unknown). No
        payload is read and nothing is quarantined.
        """
        return self._native.snapshot_size(identity, tokens)

    async def snapshot_size_async(self, identity: CacheIdentity, tokens: Tokens) -> Optional[int]:
        """:meth:`snapshot_size` for asyncio."""
        return await self._native.snapshot_size_async(identity, tokens)

    # -- restore -----------------------------------------------------------

    def restore(
        self, identity: CacheIdentity, tokens: Tokens, timeout: Optional[float] = None
    ) -> Union[Restored, Miss]:
        """Restores and verifies a context into deltapack's memory.

        Returns a :class:`Restored` (read-only, zero-copy views) or a
        :class:`Miss`. Concurrent restores of the same context share one
        read (single flight). ``timeout`` (seconds) turns into a
        ``deadline-exceeded`` miss. Raises :class:`IoError` if storage
        fails (a miss is never an exception).
        """
        return _restore_value(self._native.restore(identity, tokens, timeout))

    async def restore_async(
        self, identity: CacheIdentity, tokens: Tokens, timeout: Optional[float] = None
    ) -> Union[Restored, Miss]:
        """:meth:`restore` for asyncio."""
        return _restore_value(await self._native.restore_async(identity, tokens, timeout))

    def restore_into(
        self,
        identity: CacheIdentity,
        tokens: Tokens,
        out: Any,
        timeout: Optional[float] = None,
    ) -> Union[Hit, Miss]:
        """Restores and verifies a context directly into your buffer ``out``.

        ``out`` is any writable C-contiguous buffer of exactly
        :meth:`snapshot_size` bytes: a numpy array (any dtype), bytearray,
        mmap, memoryview, or an object with a writable
        ``__array_interface__`` (``tensor.numpy()`` for a CPU torch tensor),
        or a :class:`Buffer` from :func:`fresh_buffer` (a new buffer that
        is cheap to fault in).
        The snapshot is reconstructed in place: no result buffer is
        allocated and ``Hit.address`` is ``out``'s own address.

        Returns :class:`Hit` or :class:`Miss`. After a miss ``out`` holds no
        unverified byte: zeroed if bytes had been placed, untouched if the
        miss came first. A wrong-sized or read-only ``out`` raises
        :class:`BadInput` before any payload byte is read (``out``
        untouched). Don't touch ``out`` from other threads during the call.
        """
        return _restore_into_value(self._native.restore_into(identity, tokens, out, timeout))

    async def restore_into_async(
        self,
        identity: CacheIdentity,
        tokens: Tokens,
        out: Any,
        timeout: Optional[float] = None,
    ) -> Union[Hit, Miss]:
        """:meth:`restore_into` for asyncio (``out`` is borrowed until the await completes)."""
        v = await self._native.restore_into_async(identity, tokens, out, timeout)
        return _restore_into_value(v)

    def restore_layers_into(
        self,
        identity: CacheIdentity,
        tokens: Tokens,
        out: Any,
        order: Union[None, str, Sequence[Tuple[int, int]]] = None,
        timeout: Optional[float] = None,
    ) -> LayerIterator:
        """Restores a context into ``out`` layer by layer: each (group, layer)
        is handed out as soon as its bytes are proven, while later layers are
        still being read.

        ``out`` is what :meth:`restore_into` takes: a writable C-contiguous
        buffer of exactly :meth:`snapshot_size` bytes (numpy array, pinned
        host memory, bytearray, mmap, ``__array_interface__``, a
        :func:`fresh_buffer`), written in place. The restore starts at once (on deltapack's runtime threads)
        and the returned :class:`LayerIterator` -- a sync and an async
        iterator -- yields:

        * one :class:`Layer` per proven layer: ``out[layer.start:layer.end]``
          (byte offsets) holds its verified bytes, never written again by
          the restore; ``layer.proof`` is ``"stream-digest"`` (the layer
          matched the digest its root records for it, before the rest was
          read) or ``"whole-snapshot"`` (roots written before per-layer
          digests: the whole snapshot was verified first, then every layer
          handed out);
        * then ONE final item, what :meth:`restore_into` returns: a
          :class:`Hit` (every layer was handed out and the whole snapshot
          verified against its root) or a :class:`Miss` (check it the same
          way, ``if not outcome``);
        * then the end (``StopIteration`` / ``StopAsyncIteration``).

        ``order`` is the order layers are read and handed out in: ``None`` or
        ``"layer-major"`` (layer 0 of every group, then layer 1, ...: the
        order a forward pass needs them), ``"group-major"`` (payload order),
        or a list of ``(group, layer)`` pairs, read first in that order (the
        rest follow in payload order; with several reader threads, layers
        that are ready at about the same time may come out in either order).
        ``timeout`` (seconds) turns into a ``deadline-exceeded`` miss.

        **After a miss** the layers already handed out keep their proven
        bytes and every other byte of ``out`` is zeroed (untouched if the
        miss came before anything was written): a layer that failed
        verification is never yielded.

        Raises :class:`BadInput` at once for an ``order`` that is not one of
        the above or names a layer twice, or a read-only / non-contiguous
        ``out``. What is found from the root -- a wrong-sized ``out``, an
        ``order`` naming a layer the layout does not have -- raises
        :class:`BadInput` from the first ``next()`` (before any layer, with
        ``out`` untouched); storage failures raise :class:`IoError` there
        too. A miss is never an exception. Iteration ends after an
        exception.

        While the restore runs (until the final item), read only the layers
        already handed out and do not write ``out``; ``out`` is borrowed
        until the restore ends and released before the final item is
        yielded. Waiting for an item releases the GIL. An iterator dropped
        early does not stop the restore: it runs to its end in the
        background and ``out`` stays borrowed until then (another deltapack
        call on the same memory is refused with :class:`BadInput` meanwhile).
        """
        return self._native.restore_layers_into(
            identity, tokens, out, order, timeout, _restore_into_value
        )

    # -- operating the store -------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """Ledger gauges (bytes, roots, objects), counters accumulated by every
        process (local stores), this process's counters, free space and
        budget."""
        return self._native.stats()

    def tier_upload(self) -> Dict[str, Any]:
        """Uploads every publication acknowledged in the tier (by any process
        of this node) to the store now; returns ``uploaded``, ``conflicts``,
        ``failed`` and ``remaining`` (still journaled in the tier)."""
        return self._native.tier_upload()

    def sweep(self, grace: Union[float, str] = 3600.0, dry_run: bool = False) -> Dict[str, Any]:
        """Integrity sweep: verifies every referenced object, quarantines
        proven corruption, invalidates roots that depend on it, deletes
        unreferenced objects older than ``grace``. Returns the report."""
        return self._native.sweep(parse_duration(grace), dry_run)

    def evict(self, to: Union[int, str], dry_run: bool = False) -> Dict[str, Any]:
        """Evicts least recently used roots (with their dependent deltas)
        until the store fits ``to`` bytes (int or text like ``"40GiB"``);
        held and in-use roots are skipped. Returns the report."""
        return self._native.evict(parse_size(to), dry_run)

    def hold(self, identity: CacheIdentity, tokens: Tokens, name: str) -> None:
        """Places a named, persistent hold on a stored context: it is never
        evicted or pruned until released (1-64 characters ``[A-Za-z0-9._-]``)."""
        self._native.hold(identity, tokens, name)

    def release(self, identity: CacheIdentity, tokens: Tokens, name: str) -> bool:
        """Releases a named hold; returns whether it existed."""
        return self._native.release(identity, tokens, name)

    def inspect(self, identity: Optional[CacheIdentity] = None) -> List[Dict[str, Any]]:
        """One dict per root (optionally of one identity's namespace): schema,
        kind, boundary, digests, sizes, base context."""
        return self._native.inspect(identity)

    def flush(self) -> None:
        """Persists this handle's counters and queued accesses into the
        ledger now (also done when the handle is garbage-collected); skipped
        when the ledger was found down within the last second."""
        self._native.flush()
