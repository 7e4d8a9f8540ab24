//! The "is based on" relation between roots, shared by everything that must
//! not leave a delta without its base: eviction, pruning and invalidation
//! remove a root together with every delta built on it, and the sweep
//! invalidates the dependents of a damaged root. One walk, written once.

use std::collections::{BTreeMap, BTreeSet};

use deltapack_format::{ContextDigest, Namespace};

/// A root's identity: its namespace and context.
pub(crate) type RootId = (Namespace, ContextDigest);

/// Delta roots and their bases.
#[derive(Debug, Default)]
pub(crate) struct BaseGraph {
    base_of: BTreeMap<RootId, RootId>,
    children: BTreeMap<RootId, Vec<RootId>>,
}

impl BaseGraph {
    /// Records that `child` is a delta over `base`.
    pub(crate) fn link(&mut self, child: RootId, base: RootId) {
        self.base_of.insert(child, base);
        self.children.entry(base).or_default().push(child);
    }

    /// Every `(delta, base)` pair.
    pub(crate) fn links(&self) -> impl Iterator<Item = (&RootId, &RootId)> {
        self.base_of.iter()
    }

    /// `seeds` and every root built on one of them, transitively, each
    /// once, dependents before the roots they are built on (so removing in
    /// this order never leaves a delta without its base). Terminates on
    /// cycles (a forged store can contain one).
    pub(crate) fn with_dependents(&self, seeds: impl IntoIterator<Item = RootId>) -> Vec<RootId> {
        let mut order = Vec::new();
        let mut seen = BTreeSet::new();
        for seed in seeds {
            // Iterative post-order: (root, children pushed yet?).
            let mut stack = vec![(seed, false)];
            while let Some((r, expanded)) = stack.pop() {
                if expanded {
                    order.push(r);
                    continue;
                }
                if !seen.insert(r) {
                    continue;
                }
                stack.push((r, true));
                for c in self.children.get(&r).into_iter().flatten() {
                    if !seen.contains(c) {
                        stack.push((*c, false));
                    }
                }
            }
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> RootId {
        (Namespace([0; 32]), ContextDigest([n; 32]))
    }

    #[test]
    fn dependents_come_first_and_cycles_end() {
        let mut g = BaseGraph::default();
        // 1 ← 2 ← 3, 1 ← 4, and a forged cycle 5 ↔ 6.
        g.link(id(2), id(1));
        g.link(id(3), id(2));
        g.link(id(4), id(1));
        g.link(id(5), id(6));
        g.link(id(6), id(5));
        let order = g.with_dependents([id(1)]);
        assert_eq!(order.len(), 4);
        let pos = |n| order.iter().position(|r| *r == id(n)).expect("present");
        assert!(pos(3) < pos(2) && pos(2) < pos(1) && pos(4) < pos(1));
        assert_eq!(g.with_dependents([id(5)]).len(), 2);
        // A seed that is also a dependent of another seed appears once.
        assert_eq!(g.with_dependents([id(2), id(1)]).len(), 4);
        assert_eq!(g.links().count(), 5);
    }
}
