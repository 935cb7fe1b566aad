//! The fleet benchmark's view of the virtual Nodes in the simulated root: read whole once,
//! then kept up to date from the store's changes, and looked at each time a Node changes.
//!
//! Reading all of them again on every look (cloning and decoding 1,000 Nodes every 100 ms)
//! cost the benchmark process about a quarter of a core of the machine's two (0.88 core
//! before a takeover's kill with it, 0.61 without, from `/proc`), beside the replicas it
//! measures.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::serde::Deserialize;
use relaylet_sim::apiserver::Store;
use relaylet_sim::apiserver::kinds::{self, Kind};
use relaylet_sim::apiserver::store::Change;

/// The prefix of the fleet's virtual Node names (relaylet's `relaylet-<leaf>`, leaves `leaf-N`).
const VIRTUAL: &str = "relaylet-leaf-";

/// The virtual Nodes as of revision `rv`, by name.
pub struct NodeView {
    rv: u64,
    nodes: BTreeMap<String, Node>,
}

impl NodeView {
    /// The virtual Nodes now.
    pub fn read(store: &Store) -> anyhow::Result<NodeView> {
        let (items, rv) = store.list(nodes_kind()?, None);
        let mut nodes = BTreeMap::new();
        for item in items {
            let node = Node::deserialize(&*item)?;
            let name = node.metadata.name.clone().unwrap_or_default();
            if name.starts_with(VIRTUAL) {
                nodes.insert(name, node);
            }
        }
        Ok(NodeView { rv, nodes })
    }

    pub fn iter(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Takes in the Node changes since the view's revision (all of them read again when the
    /// store no longer keeps them).
    fn update(&mut self, store: &Store) -> anyhow::Result<()> {
        let Ok((events, rv)) = store.events_since(self.rv) else {
            *self = NodeView::read(store)?;
            return Ok(());
        };
        for event in events {
            if !event.key.group.is_empty() || event.key.resource != "nodes" {
                continue;
            }
            if !event.key.name.starts_with(VIRTUAL) {
                continue;
            }
            match event.change {
                Change::Deleted => {
                    self.nodes.remove(&event.key.name);
                }
                _ => {
                    self.nodes
                        .insert(event.key.name, Node::deserialize(&*event.object)?);
                }
            }
        }
        self.rv = rv;
        Ok(())
    }

    /// Waits until `done` holds for the virtual Nodes, looking again whenever one changes.
    pub async fn wait(
        store: &Store,
        limit: Duration,
        what: &str,
        mut done: impl FnMut(&NodeView) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        // Subscribed before the read: a change between the two wakes the loop.
        let mut changed = store.subscribe_kind(nodes_kind()?);
        let mut view = NodeView::read(store)?;
        while !done(&view) {
            let left = deadline.saturating_duration_since(Instant::now());
            anyhow::ensure!(
                !left.is_zero()
                    && tokio::time::timeout(left, changed.changed())
                        .await
                        .is_ok_and(|r| r.is_ok()),
                "{what}: not within {limit:?}"
            );
            view.update(store)?;
        }
        Ok(())
    }
}

fn nodes_kind() -> anyhow::Result<&'static Kind> {
    kinds::by_resource("", "nodes").ok_or_else(|| anyhow::anyhow!("the sim serves no Nodes"))
}
