//! Page layouts: how a snapshot's bytes are organised into pages.
//!
//! A [`PageLayout`] is an ordered list of [`PageGroup`]s. A `full` group
//! (attention KV) holds one page per `tokens_per_page` tokens, the last one
//! possibly partial: `ceil(boundary / tokens_per_page)` pages. A `recurrent`
//! group (e.g. a state-space layer) holds exactly one checkpoint page that
//! summarises the whole prefix. Each group has layers; a layer contributes
//! `bytes_per_page` bytes to every page of its group.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Most groups a layout may have.
pub const MAX_GROUPS: usize = 256;
/// Most layers one group may have.
pub const MAX_LAYERS_PER_GROUP: usize = 4096;
/// Largest page of one layer (1 GiB).
pub const MAX_BYTES_PER_PAGE: u64 = 1 << 30;
/// Longest layer name or dtype string.
pub const MAX_NAME_LEN: usize = 256;

/// The kind of a page group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupKind {
    /// One page per `tokens_per_page` tokens.
    Full,
    /// Exactly one checkpoint page.
    Recurrent,
}

/// One layer of a page group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerSpec {
    /// Layer name, e.g. `layer.0.kv`.
    pub name: String,
    /// Element type, e.g. `bf16`.
    pub dtype: String,
    /// Bytes this layer stores per page.
    pub bytes_per_page: u64,
}

/// An ordered group of layers sharing one page geometry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageGroup {
    /// Full attention or recurrent checkpoint.
    pub kind: GroupKind,
    /// Tokens covered by one page (for `recurrent`, the checkpoint cadence).
    pub tokens_per_page: u32,
    /// The layers, in payload order.
    pub layers: Vec<LayerSpec>,
}

/// The ordered page groups of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageLayout {
    /// Groups in payload order.
    pub groups: Vec<PageGroup>,
}

impl PageGroup {
    /// Bytes of one page across all layers of the group.
    pub fn page_bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.bytes_per_page).sum()
    }

    /// Pages this group holds at `boundary` tokens.
    pub fn block_count(&self, boundary: u64) -> u64 {
        match self.kind {
            GroupKind::Full => boundary.div_ceil(u64::from(self.tokens_per_page.max(1))),
            GroupKind::Recurrent => 1,
        }
    }
}

impl PageLayout {
    /// Checks structural limits (counts, sizes, names).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Layout(m));
        if self.groups.is_empty() || self.groups.len() > MAX_GROUPS {
            return bad(format!(
                "{} groups (must be 1..={MAX_GROUPS})",
                self.groups.len()
            ));
        }
        for (gi, g) in self.groups.iter().enumerate() {
            if g.tokens_per_page == 0 {
                return bad(format!("group {gi}: tokens_per_page must be positive"));
            }
            if g.layers.is_empty() || g.layers.len() > MAX_LAYERS_PER_GROUP {
                return bad(format!(
                    "group {gi}: {} layers (must be 1..={MAX_LAYERS_PER_GROUP})",
                    g.layers.len()
                ));
            }
            for (li, l) in g.layers.iter().enumerate() {
                if l.bytes_per_page == 0 || l.bytes_per_page > MAX_BYTES_PER_PAGE {
                    return bad(format!(
                        "group {gi} layer {li}: bytes_per_page {} (must be 1..={MAX_BYTES_PER_PAGE})",
                        l.bytes_per_page
                    ));
                }
                if l.name.len() > MAX_NAME_LEN || l.dtype.len() > MAX_NAME_LEN {
                    return bad(format!(
                        "group {gi} layer {li}: name or dtype longer than {MAX_NAME_LEN}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The block count of every group at `boundary` tokens.
    pub fn block_counts(&self, boundary: u64) -> Vec<u64> {
        self.groups
            .iter()
            .map(|g| g.block_count(boundary))
            .collect()
    }

    /// Checks that `counts` are exactly the block counts at `boundary`.
    pub fn check_counts(&self, boundary: u64, counts: &[u64]) -> Result<()> {
        let expected = self.block_counts(boundary);
        if expected.as_slice() != counts {
            return Err(Error::Layout(format!(
                "block counts {counts:?} inconsistent with layout at boundary {boundary} (expected {expected:?})"
            )));
        }
        Ok(())
    }

    /// Payload bytes for `counts`, with overflow checks.
    pub fn payload_len(&self, counts: &[u64]) -> Result<u64> {
        if counts.len() != self.groups.len() {
            return Err(Error::Layout(format!(
                "{} block counts for {} groups",
                counts.len(),
                self.groups.len()
            )));
        }
        let mut total = 0u64;
        for (g, &c) in self.groups.iter().zip(counts) {
            let add = g
                .page_bytes()
                .checked_mul(c)
                .ok_or_else(|| Error::Bounds("payload length overflows u64".into()))?;
            total = total
                .checked_add(add)
                .ok_or_else(|| Error::Bounds("payload length overflows u64".into()))?;
        }
        Ok(total)
    }

    /// Byte offset (within a payload with `counts`) of each (group, layer)
    /// region, in payload order: `offsets[g][l]`.
    pub fn layer_offsets(&self, counts: &[u64]) -> Result<Vec<Vec<u64>>> {
        self.payload_len(counts)?;
        let mut off = 0u64;
        let mut out = Vec::with_capacity(self.groups.len());
        for (g, &c) in self.groups.iter().zip(counts) {
            let mut row = Vec::with_capacity(g.layers.len());
            for l in &g.layers {
                row.push(off);
                off += l.bytes_per_page * c;
            }
            out.push(row);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> PageLayout {
        PageLayout {
            groups: vec![
                PageGroup {
                    kind: GroupKind::Full,
                    tokens_per_page: 256,
                    layers: vec![
                        LayerSpec {
                            name: "k".into(),
                            dtype: "bf16".into(),
                            bytes_per_page: 100,
                        },
                        LayerSpec {
                            name: "v".into(),
                            dtype: "bf16".into(),
                            bytes_per_page: 50,
                        },
                    ],
                },
                PageGroup {
                    kind: GroupKind::Recurrent,
                    tokens_per_page: 256,
                    layers: vec![LayerSpec {
                        name: "ssm".into(),
                        dtype: "f32".into(),
                        bytes_per_page: 7,
                    }],
                },
            ],
        }
    }

    #[test]
    fn counts_offsets_and_lengths() {
        let l = layout();
        l.validate().expect("valid");
        assert_eq!(l.block_counts(512), vec![2, 1]);
        assert_eq!(l.block_counts(513), vec![3, 1]);
        assert_eq!(l.payload_len(&[2, 1]).expect("len"), 2 * 150 + 7);
        assert_eq!(
            l.layer_offsets(&[2, 1]).expect("offs"),
            vec![vec![0, 200], vec![300]]
        );
        assert!(l.check_counts(512, &[3, 1]).is_err());
        assert!(l.payload_len(&[u64::MAX, 1]).is_err());
    }

    #[test]
    fn validation_limits() {
        let mut l = layout();
        l.groups[0].tokens_per_page = 0;
        assert!(l.validate().is_err());
        let mut l = layout();
        l.groups[1].layers[0].bytes_per_page = 0;
        assert!(l.validate().is_err());
        assert!(PageLayout { groups: vec![] }.validate().is_err());
    }
}
