//! Which live replica serves which virtual node: every replica computes the same answer from
//! the same two lists (the registered nodes and the live replicas), so no coordinator is needed.
//!
//! Each node ranks the replicas by a hash of (node, replica), rendezvous hashing, and takes the
//! best-ranked one that still has room; room is `ceil(nodes / replicas)`. Then a replica left
//! below `floor(nodes / replicas)` takes, one at a time, the node it ranks best among those of
//! replicas above it. So every replica holds ⌊n/r⌋ or ⌈n/r⌉ (6 nodes on 3 replicas is 2-2-2,
//! never the 4-1-1 plain rendezvous hashing can give, and 4 on 3 is 2-1-1, never 2-2-0); the
//! ranking keeps it stable: a replica that joins or leaves moves about its share of nodes, not
//! all of them. The leader's computation is the one published (`published`), so replicas of two
//! versions agree as long as the leader runs; each replica's own is only a fallback. The hash is FNV-1a with a fixed finaliser, not std's hasher, whose
//! output may change between Rust releases: replicas of two relaylet versions during a rolling
//! upgrade must agree.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Each node's replica.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Assignment(BTreeMap<Arc<str>, Arc<str>>);

impl Assignment {
    /// Assigns every node in `nodes` to one of `replicas` (none when there is no replica).
    pub fn compute<'n, 'r>(
        nodes: impl IntoIterator<Item = &'n str>,
        replicas: impl IntoIterator<Item = &'r str>,
    ) -> Assignment {
        let mut replicas: Vec<&str> = replicas.into_iter().collect();
        replicas.sort_unstable();
        replicas.dedup();
        let mut nodes: Vec<&str> = nodes.into_iter().collect();
        nodes.sort_unstable();
        nodes.dedup();
        if replicas.is_empty() {
            return Assignment::default();
        }
        let room = nodes.len().div_ceil(replicas.len());
        // Nodes take their turn in an order of their own hash, so no replica is favoured by
        // how nodes happen to be named.
        nodes.sort_by_cached_key(|n| (score(n, ""), *n));
        let mut load: HashMap<&str, usize> = HashMap::new();
        let mut out: BTreeMap<&str, &str> = BTreeMap::new();
        for node in nodes {
            let mut ranked = replicas.clone();
            ranked.sort_by_key(|r| std::cmp::Reverse((score(node, r), *r)));
            let chosen = ranked
                .iter()
                .find(|r| load.get(*r).copied().unwrap_or(0) < room)
                .copied()
                .unwrap_or(ranked[0]);
            *load.entry(chosen).or_default() += 1;
            out.insert(node, chosen);
        }
        let floor = out.len() / replicas.len();
        while let Some(under) = replicas
            .iter()
            .copied()
            .find(|r| load.get(r).copied().unwrap_or(0) < floor)
        {
            // Some other replica holds more than the floor (the loads add up to the nodes).
            let Some((node, from)) = out
                .iter()
                .filter(|(_, r)| load.get(**r).copied().unwrap_or(0) > floor)
                .max_by_key(|(n, _)| (score(n, under), **n))
                .map(|(n, r)| (*n, *r))
            else {
                break;
            };
            *load.entry(from).or_default() -= 1;
            *load.entry(under).or_default() += 1;
            out.insert(node, under);
        }
        Assignment(
            out.into_iter()
                .map(|(n, r)| (Arc::from(n), Arc::from(r)))
                .collect(),
        )
    }

    /// The replica assigned `node`.
    pub fn replica_of(&self, node: &str) -> Option<&str> {
        self.0.get(node).map(|r| &**r)
    }

    /// Every (node, replica), by node name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, r)| (&**n, &**r))
    }

    /// How many nodes the assignment names.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it names no node.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many nodes each replica serves.
    pub fn loads(&self) -> BTreeMap<&str, usize> {
        let mut out = BTreeMap::new();
        for replica in self.0.values() {
            *out.entry(&**replica).or_default() += 1;
        }
        out
    }
}

impl FromIterator<(Arc<str>, Arc<str>)> for Assignment {
    /// An assignment as given (read back from where the leader published it).
    fn from_iter<I: IntoIterator<Item = (Arc<str>, Arc<str>)>>(pairs: I) -> Assignment {
        Assignment(pairs.into_iter().collect())
    }
}

/// A stable 64-bit hash of (node, replica): FNV-1a, then a splitmix64 finaliser so that names
/// differing in one last character still land far apart.
fn score(node: &str, replica: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.bytes().chain([0]).chain(replica.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    }

    fn assign(nodes: &[String], replicas: &[String]) -> Assignment {
        Assignment::compute(
            nodes.iter().map(String::as_str),
            replicas.iter().map(String::as_str),
        )
    }

    #[test]
    fn every_node_gets_one_replica_and_the_spread_is_even() {
        for (n, r) in [
            (6, 3),
            (7, 3),
            (100, 3),
            (1000, 7),
            (2, 3),
            (1, 1),
            (4, 3),
            (5, 4),
            (9, 4),
            (11, 5),
        ] {
            let nodes = names("relaylet-leaf-", n);
            let replicas = names("relaylet-7d9f-", r);
            let a = assign(&nodes, &replicas);
            for node in &nodes {
                assert!(
                    replicas
                        .iter()
                        .any(|r| Some(r.as_str()) == a.replica_of(node))
                );
            }
            let room = n.div_ceil(r);
            let floor = n / r;
            let loads = a.loads();
            assert!(loads.values().all(|l| *l <= room), "{n}/{r}: {loads:?}");
            // Every replica holds at least the floor (one holding none is absent from loads).
            let held: usize = replicas
                .iter()
                .map(|rep| loads.get(rep.as_str()).copied().unwrap_or(0))
                .filter(|l| *l >= floor)
                .count();
            assert_eq!(held, r, "{n}/{r}: {loads:?}");
            assert_eq!(loads.values().sum::<usize>(), n);
        }
    }

    #[test]
    fn every_replica_computes_the_same_answer_whatever_the_order_it_lists_in() {
        let nodes = names("n", 50);
        let replicas = names("r", 4);
        let mut reversed_nodes = nodes.clone();
        reversed_nodes.reverse();
        let mut reversed_replicas = replicas.clone();
        reversed_replicas.reverse();
        assert_eq!(
            assign(&nodes, &replicas),
            assign(&reversed_nodes, &reversed_replicas)
        );
    }

    /// The hash is part of the protocol between replicas (two versions must agree): pinned.
    #[test]
    fn the_hash_is_fixed() {
        assert_eq!(
            score("relaylet-leaf-1", "relaylet-0"),
            0x7cd9_f102_cb52_f096
        );
    }

    #[test]
    fn a_replica_joining_or_leaving_moves_about_its_share() {
        let nodes = names("relaylet-leaf-", 300);
        let three = names("replica-", 3);
        let four = names("replica-", 4);
        let before = assign(&nodes, &three);
        let after = assign(&nodes, &four);
        let moved = nodes
            .iter()
            .filter(|n| before.replica_of(n) != after.replica_of(n))
            .count();
        // The newcomer's fair share is 75; the cap moves a few more.
        assert!((60..=120).contains(&moved), "{moved} of 300 moved");
        // Leaving: only the leaver's nodes and a few for balance move.
        let back = assign(&nodes, &three);
        assert_eq!(back, before);
    }

    #[test]
    fn no_replica_no_assignment() {
        let a = assign(&names("n", 3), &[]);
        assert_eq!(a.replica_of("n0"), None);
    }
}
