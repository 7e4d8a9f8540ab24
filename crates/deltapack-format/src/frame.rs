//! The framing the delta and the snapshot encodings both open with:
//! 8 magic bytes, a little-endian `u32` header length, then that many
//! bytes of CBOR header. Owns the checks on that length against its bound
//! and against the bytes present; it must never allocate or decode before
//! both have passed.

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// Bytes before the header: the magic and the length.
pub(crate) const PREFIX_LEN: usize = 12;

/// One encoding's framing: its magic, its header bound and how its errors
/// read.
pub(crate) struct Framing {
    /// The 8 bytes the encoding starts with.
    magic: [u8; 8],
    /// The largest header length accepted.
    max_header: u32,
    /// The encoding's name in messages (`delta`, `snapshot`).
    name: &'static str,
    /// The encoding's error variant.
    error: fn(String) -> Error,
    /// The message for a wrong magic.
    bad_magic: &'static str,
}

impl Framing {
    /// The framing of the encoding `name`, whose errors are `error`.
    pub(crate) const fn new(
        magic: [u8; 8],
        max_header: u32,
        name: &'static str,
        error: fn(String) -> Error,
    ) -> Framing {
        Framing {
            magic,
            max_header,
            name,
            error,
            bad_magic: "bad magic",
        }
    }

    /// The message a wrong magic gets.
    pub(crate) const fn bad_magic(self, message: &'static str) -> Framing {
        Framing {
            bad_magic: message,
            ..self
        }
    }

    /// The length of the whole prefix (magic, length, header) from the
    /// first [`PREFIX_LEN`] bytes or more, the header length checked
    /// against its bound (nothing allocated or decoded).
    pub(crate) fn prefix_len(&self, bytes: &[u8]) -> Result<usize> {
        let error = self.error;
        if bytes.len() < PREFIX_LEN {
            return Err(error(format!(
                "{} bytes is shorter than the {} prefix",
                bytes.len(),
                self.name
            )));
        }
        if bytes[..8] != self.magic {
            return Err(error(self.bad_magic.into()));
        }
        let hlen = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if hlen > self.max_header {
            return Err(Error::Bounds(format!(
                "{} header length {hlen} exceeds {}",
                self.name, self.max_header
            )));
        }
        Ok(PREFIX_LEN + hlen as usize)
    }

    /// Decodes the header from the first bytes of an encoding (which may
    /// be only a prefix). Returns the header and the offset past it.
    pub(crate) fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<(T, usize)> {
        let error = self.error;
        let end = self.prefix_len(bytes)?;
        if end > bytes.len() {
            return Err(error(format!(
                "header length {} runs past the {} bytes present",
                end - PREFIX_LEN,
                bytes.len()
            )));
        }
        let header = serde_cbor::from_slice(&bytes[PREFIX_LEN..end])
            .map_err(|e| error(format!("header: {e}")))?;
        Ok((header, end))
    }
}
