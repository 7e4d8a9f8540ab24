"""Type stubs of deltapack._native, the Rust extension module.

The public API is the ``deltapack`` package; these are its building blocks.
"""

from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Iterator, List, Literal, Optional, Sequence, Tuple, Union

__version__: str

class Error(Exception):
    """Base class of every deltapack failure (a miss is not a failure)."""

class CapacityError(Error):
    """The store is full and nothing evictable frees enough; nothing was written."""

class ConflictError(Error):
    """The context already holds a different snapshot; nothing was written."""

class BadInput(Error):
    """Invalid input (identity, tokens, snapshot, base, buffer); nothing was read or written."""

class IoError(Error):
    """Storage I/O failed (file system, S3, the capacity ledger)."""

class LedgerMismatchError(Error):
    """This handle's ledger is not the store's: it may read, not publish or delete; nothing was changed."""

class CacheIdentity:
    """Everything that makes cached state valid for a reader."""

    def __init__(
        self,
        model_checkpoint: str,
        quantization: str,
        rope_layout: str,
        *,
        draft_checkpoint: Optional[str] = None,
        tp_degree: int = 1,
        tp_rank: int = 0,
        dcp_degree: int = 1,
        dcp_rank: int = 0,
        chunk_tokens: int = 256,
        salt: str = "",
        attributes: Optional[Dict[str, str]] = None,
        publication_schema: Optional[str] = None,
    ) -> None: ...
    @staticmethod
    def from_json(text: Union[str, bytes]) -> "CacheIdentity":
        """Parses and validates an identity from JSON text."""
    @staticmethod
    def example() -> "CacheIdentity":
        """The example identity (``deltapack identity --example``)."""
    def to_json(self) -> str:
        """Pretty JSON text (what ``from_json`` reads)."""
    @property
    def namespace(self) -> str:
        """The namespace (64 hex characters)."""
    @property
    def chunk_tokens(self) -> int:
        """Snapshots are published at multiples of this many tokens."""
    def context(self, tokens: Any) -> str:
        """The context digest (64 hex) of token ids."""
    def boundaries(self, tokens: Any) -> List[Tuple[int, str]]:
        """``(boundary, context)`` at every full-chunk boundary of ``tokens``."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class SnapshotData:
    """A snapshot encoding in deltapack's (Rust) memory; read-only."""

    def __len__(self) -> int: ...
    @property
    def address(self) -> int:
        """Address of the first byte (valid while this object lives)."""
    @property
    def boundary(self) -> int:
        """Tokens covered."""
    def digest(self) -> str:
        """BLAKE3 of the encoding (``blake3:…``)."""
    def layers_digest(self) -> str:
        """The layered snapshot digest (``blake3-layers:…``) v2.2 roots record."""
    def tobytes(self) -> bytes:
        """A copy as bytes."""
    @property
    def __array_interface__(self) -> Dict[str, Any]:
        """numpy's array interface of the read-only bytes."""
    def layout(self) -> Tuple[int, int, List[Any]]:
        """The page layout (see ``snapshot_layout``)."""

class FreshBuffer:
    """Zero-filled, writable memory in deltapack's (Rust) memory (the public class is ``deltapack.Buffer``)."""

    def __len__(self) -> int: ...
    @property
    def address(self) -> int:
        """Address of the first byte (valid while this object lives)."""
    @property
    def __array_interface__(self) -> Dict[str, Any]:
        """numpy's array interface of the writable bytes."""

_Restore = Union[Tuple[str, SnapshotData, str, str], Tuple[str, str, str, Optional[str]]]
_RestoreInto = Union[Tuple[str, int, str, int], Tuple[str, str, str, Optional[str]]]

class Store:
    """The native store handle (the public class is ``deltapack.Store``)."""

    def __init__(
        self,
        url: str,
        *,
        ledger: Optional[str] = None,
        ledger_url: Optional[str] = None,
        budget: Optional[int] = None,
        min_free: Optional[int] = None,
        grace: Optional[float] = None,
        root_key: Optional[bytes] = None,
        max_extent_bytes: Optional[int] = None,
        compression: Optional[int] = None,
        max_chain_depth: Optional[int] = None,
        max_read_overhead: Optional[float] = None,
        prefill_rate: Optional[float] = None,
        tier: Optional[str] = None,
        tier_budget: Optional[int] = None,
        tier_ack: Optional[str] = None,
    ) -> None: ...
    @property
    def url(self) -> str: ...
    def publish(
        self,
        identity: CacheIdentity,
        tokens: Any,
        snapshot: Any,
        base_tokens: Any = None,
        base_snapshot: Any = None,
    ) -> Dict[str, Any]: ...
    def publish_async(
        self,
        identity: CacheIdentity,
        tokens: Any,
        snapshot: Any,
        base_tokens: Any = None,
        base_snapshot: Any = None,
    ) -> Awaitable[Dict[str, Any]]: ...
    def publish_turn(
        self, identity: CacheIdentity, tokens: Any, prev: "Turn", tail: Any
    ) -> Dict[str, Any]: ...
    def publish_turn_async(
        self, identity: CacheIdentity, tokens: Any, prev: "Turn", tail: Any
    ) -> Awaitable[Dict[str, Any]]: ...
    def turn_from(self, identity: CacheIdentity, tokens: Any, snapshot: Any) -> "Turn": ...
    def restore(self, identity: CacheIdentity, tokens: Any, timeout: Optional[float] = None) -> _Restore: ...
    def restore_async(
        self, identity: CacheIdentity, tokens: Any, timeout: Optional[float] = None
    ) -> Awaitable[_Restore]: ...
    def restore_into(
        self, identity: CacheIdentity, tokens: Any, out: Any, timeout: Optional[float] = None
    ) -> _RestoreInto: ...
    def restore_into_async(
        self, identity: CacheIdentity, tokens: Any, out: Any, timeout: Optional[float] = None
    ) -> Awaitable[_RestoreInto]: ...
    def restore_layers_into(
        self,
        identity: CacheIdentity,
        tokens: Any,
        out: Any,
        order: Union[None, str, Sequence[Tuple[int, int]]] = None,
        timeout: Optional[float] = None,
        finish: Optional[Callable[[_RestoreInto], Any]] = None,
    ) -> "LayerIterator":
        """Starts a layer-wise restore into ``out``: a ``Layer`` per proven
        layer, then the ``restore_into`` tuple (passed through ``finish``)."""
    def snapshot_size(self, identity: CacheIdentity, tokens: Any) -> Optional[int]: ...
    def snapshot_size_async(self, identity: CacheIdentity, tokens: Any) -> Awaitable[Optional[int]]: ...
    def lookup(self, identity: CacheIdentity, tokens: Any) -> Optional[Tuple[int, str, str]]: ...
    def lookup_async(self, identity: CacheIdentity, tokens: Any) -> Awaitable[Optional[Tuple[int, str, str]]]: ...
    def stats(self) -> Dict[str, Any]: ...
    def tier_upload(self) -> Dict[str, Any]: ...
    def sweep(self, grace: float = 3600.0, dry_run: bool = False) -> Dict[str, Any]: ...
    def evict(self, to: int, dry_run: bool = False) -> Dict[str, Any]: ...
    def hold(self, identity: CacheIdentity, tokens: Any, name: str) -> None: ...
    def release(self, identity: CacheIdentity, tokens: Any, name: str) -> bool: ...
    def inspect(self, identity: Optional[CacheIdentity] = None) -> List[Dict[str, Any]]: ...
    def flush(self) -> None: ...

def snapshot_layout(obj: Any) -> Tuple[int, int, List[Any]]:
    """The page layout of a snapshot encoding in any buffer."""

def snapshot_prefix(layout: str, boundary: int) -> Tuple[bytes, int]:
    """The header bytes of a snapshot of ``layout`` (JSON) and its total length."""

def synth(tokens: int, preset: str = "tiny", seed: int = 1) -> Tuple[SnapshotData, List[int]]:
    """A deterministic synthetic conversation: snapshot and token ids."""

def buffer_address(obj: Any) -> int:
    """The address of the first byte of a buffer."""

def fresh_buffer(nbytes: int) -> FreshBuffer:
    """A zero-filled buffer of ``nbytes`` bytes, no page touched (``MemoryError`` if it cannot be allocated)."""

class Turn:
    """A published turn: what ``Store.publish_turn`` needs to publish the next one."""

    @property
    def boundary(self) -> int: ...
    @property
    def digest(self) -> str: ...
    @property
    def context(self) -> str: ...
    @property
    def kept_pages(self) -> List[int]: ...
    def tail_len(self, boundary: int) -> int: ...
    def tail_of(self, snapshot: Any) -> bytes: ...


class Layer:
    """One proven layer of a layer-wise restore: its bytes are
    ``out[start:end]``, never written again by the restore."""

    @property
    def group(self) -> int:
        """The page group (index in the layout)."""
    @property
    def layer(self) -> int:
        """The layer within its group."""
    @property
    def stream(self) -> int:
        """The stream's index in payload order."""
    @property
    def start(self) -> int:
        """Offset of the layer's first byte in ``out``."""
    @property
    def end(self) -> int:
        """Offset just past its last byte."""
    @property
    def proof(self) -> Literal["stream-digest", "whole-snapshot"]:
        """How it was proven: its own recorded digest, or the whole snapshot first."""

class LayerIterator(Iterator[Any], AsyncIterator[Any]):
    """The items of ``Store.restore_layers_into``: a ``Layer`` per proven
    layer, then one final item (``Hit`` or ``Miss`` from the public
    ``deltapack.Store``), then the end. Sync (``for``) and async
    (``async for``); waiting releases the GIL."""

    def __iter__(self) -> "LayerIterator": ...
    def __next__(self) -> Any: ...
    def __aiter__(self) -> "LayerIterator": ...
    def __anext__(self) -> Awaitable[Any]: ...
