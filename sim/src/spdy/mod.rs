//! SPDY/3.1 as Kubernetes uses it: frames, compressed header blocks, and connections with streams.
