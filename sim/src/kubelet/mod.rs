//! The kubelet stand-in: the kubelet streaming API backed by real local processes.
