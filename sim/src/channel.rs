//! The `channel.k8s.io` WebSocket protocol family: channel-prefixed frames for remote commands and port-forward.
